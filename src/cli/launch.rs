//! `ppl launch`: torchrun-style flags turned into an `mpirun` command line.
//!
//! `ppl launch --nproc-per-node 4 --hosts h1,h2 -- eval --model m.gguf --data t.txt` runs
//! `mpirun -np 8 --host h1:4,h2:4 [--bind-to none] <this ppl> eval …`; `--dry-run` prints it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Processes (ranks) per node.
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Comma-separated host names [default: this machine only].
    #[arg(long, conflicts_with = "hostfile")]
    hosts: Option<String>,
    /// An MPI hostfile.
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// What starts the ranks: `mpirun` (Open MPI or MPICH) or Slurm's `srun` (inside an
    /// allocation, or with --hosts naming Slurm nodes).
    #[arg(long, value_enum, default_value_t = Launcher::Mpirun)]
    launcher: Launcher,
    /// The mpirun executable.
    #[arg(long, default_value = "mpirun")]
    mpirun: String,
    /// Extra arguments for the launcher (repeatable), e.g. --mpirun-arg=--oversubscribe.
    #[arg(long = "mpirun-arg", allow_hyphen_values = true)]
    mpirun_args: Vec<String>,
    /// Print the command instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// The ppl command to run on every rank (after `--`), e.g. `eval --model … --data …`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Launcher {
    Mpirun,
    Srun,
}

/// The srun argument list (without the program name): `--ntasks-per-node`, the nodes when
/// named, and `--kill-on-bad-exit` so that one failed rank ends the job. Slurm passes the whole
/// environment to the ranks and has its own timeouts for lost nodes.
pub fn srun_args(args: &LaunchArgs, exe: &Path) -> anyhow::Result<Vec<String>> {
    if args.nproc_per_node == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    if args.hostfile.is_some() {
        bail!("--hostfile is for mpirun; with --launcher srun name the nodes with --hosts, or run inside an allocation (salloc/sbatch)");
    }
    let mut out = vec![
        format!("--ntasks-per-node={}", args.nproc_per_node),
        "--kill-on-bad-exit=1".to_string(),
    ];
    if let Some(hosts) = &args.hosts {
        let hosts: Vec<&str> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect();
        out.push(format!("--nodes={}", hosts.len().max(1)));
        out.push(format!("--nodelist={}", hosts.join(",")));
    }
    out.extend(args.mpirun_args.iter().cloned());
    out.push(exe.display().to_string());
    out.extend(args.command.iter().cloned());
    Ok(out)
}

/// Finds an executable on PATH (or checks an explicit path).
fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The mpirun argument list (without the program name).
pub fn mpirun_args(args: &LaunchArgs, exe: &Path, open_mpi: bool) -> anyhow::Result<Vec<String>> {
    if args.nproc_per_node == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    let hosts: Vec<&str> = args
        .hosts
        .as_deref()
        .map(|h| {
            h.split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    if let Some(f) = &args.hostfile {
        out.extend(["--hostfile".to_string(), f.display().to_string()]);
        out.extend(["--npernode".to_string(), args.nproc_per_node.to_string()]);
    } else {
        let nodes = hosts.len().max(1);
        out.extend(["-np".to_string(), (nodes * args.nproc_per_node).to_string()]);
        if !hosts.is_empty() {
            let spec: Vec<String> = hosts
                .iter()
                .map(|h| format!("{h}:{}", args.nproc_per_node))
                .collect();
            out.extend(["--host".to_string(), spec.join(",")]);
        }
    }
    if open_mpi {
        // Each rank runs several compute threads: do not pin a rank to one core.
        out.extend(["--bind-to".to_string(), "none".to_string()]);
        if running_as_root() {
            out.push("--allow-run-as-root".to_string());
        }
        out.extend(lost_host_settings(crate::comm::comm_timeout().as_secs()));
        // ppl's own settings reach every rank (Open MPI forwards only what -x names).
        let mut forwarded: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.starts_with("PPL_"))
            .collect();
        forwarded.sort();
        for k in forwarded {
            out.extend(["-x".to_string(), k]);
        }
    }
    out.extend(args.mpirun_args.iter().cloned());
    out.push(exe.display().to_string());
    out.extend(args.command.iter().cloned());
    Ok(out)
}

/// Open MPI's out-of-band keepalive, so that mpirun and its daemons give up on a lost host:
/// by default they notice one only after 8 minutes of silence (300 s idle, then 9 probes 20 s
/// apart), and mpirun cannot end a job whose host it cannot reach. Probes every 5 s after 10 s
/// of silence, given up after `timeout` + 5 s of unanswered probes: the daemons drop a lost host
/// 5–15 s after ppl's own `PPL_COMM_TIMEOUT` would name it, and the whole job ends within
/// `timeout` + 30 s either way.
pub fn lost_host_settings(timeout_s: u64) -> Vec<String> {
    let probes = (timeout_s + 5).div_ceil(5).max(1);
    [
        ("oob_tcp_keepalive_time", 10),
        ("oob_tcp_keepalive_intvl", 5),
        ("oob_tcp_keepalive_probes", probes),
    ]
    .iter()
    .flat_map(|(k, v)| ["--mca".to_string(), k.to_string(), v.to_string()])
    .collect()
}

/// What mpirun or a rank prints when the job is being aborted: from then on mpirun gets
/// [`ABORT_GRACE`] to end before `ppl launch` ends it.
const ABORT_MARKERS: [&str; 4] = [
    "aborting the MPI job",
    "MPI_ABORT was invoked",
    "lost communication with a remote daemon",
    "abort is already in progress",
];

/// How long mpirun may take to end an aborted job. Open MPI 4 waits for every daemon to
/// confirm that its ranks are gone, and a daemon on a host that cannot be reached never does.
const ABORT_GRACE: Duration = Duration::from_secs(15);

/// Runs mpirun, passing its output through, and ends it if it outlives an abort by
/// [`ABORT_GRACE`]: SIGINT, then SIGKILL 3 s later.
fn supervise(mut child: Child) -> anyhow::Result<ExitStatus> {
    let aborted_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut pumps = Vec::new();
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, std::io::stderr(), aborted_at.clone()));
    }
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, std::io::stdout(), aborted_at.clone()));
    }
    let mut signals_sent = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let since = *aborted_at.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = since {
            let late = t.elapsed().saturating_sub(ABORT_GRACE);
            let due = match signals_sent {
                0 => late > Duration::ZERO,
                1 => late > Duration::from_secs(3),
                _ => false,
            };
            if due {
                if signals_sent == 0 {
                    eprintln!(
                        "[ppl launch] mpirun has not ended {} s after the job aborted (a host may be unreachable): stopping it",
                        ABORT_GRACE.as_secs()
                    );
                }
                // A second SIGINT makes Open MPI 4's mpirun crash in its own clean-up.
                let signal = if signals_sent == 0 {
                    libc::SIGINT
                } else {
                    libc::SIGKILL
                };
                // SAFETY: kill(2) on our own child's pid; no memory is involved.
                unsafe { libc::kill(child.id() as libc::pid_t, signal) };
                signals_sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Daemons that were cut off may hold the pipes open: do not wait for them.
    drop(pumps);
    Ok(status)
}

/// Copies `from` to `to` line by line, noting when a line announces an abort.
fn pump(
    from: impl Read + Send + 'static,
    mut to: impl Write + Send + 'static,
    aborted_at: Arc<Mutex<Option<Instant>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line);
            if ABORT_MARKERS.iter().any(|m| text.contains(m)) {
                aborted_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(Instant::now);
            }
            let _ = to.write_all(&line);
            let _ = to.flush();
            line.clear();
        }
    })
}

pub fn run(args: LaunchArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot locate the ppl executable")?;
    let mpirun = which(&args.mpirun);
    if args.launcher == Launcher::Srun {
        return start(&args, "srun", srun_args(&args, &exe)?);
    }
    let open_mpi = match &mpirun {
        Some(m) => Command::new(m)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
            .unwrap_or(false),
        None => true,
    };
    let argv = mpirun_args(&args, &exe, open_mpi)?;
    let program = args.mpirun.clone();
    start(&args, &program, argv)
}

/// Prints and runs (or with --dry-run only prints) `program argv…`, supervised.
fn start(args: &LaunchArgs, program: &str, argv: Vec<String>) -> anyhow::Result<ExitCode> {
    let shown = std::iter::once(program.to_string())
        .chain(argv.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    if args.dry_run {
        println!("{shown}");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(path) = which(program) else {
        bail!(
            "'{program}' was not found on PATH: install an MPI launcher (OpenMPI: apt-get install openmpi-bin; or MPICH; Slurm: slurm-client), \
             build ppl with --features mpi, or pass --mpirun /path/to/mpirun"
        );
    };
    eprintln!("[ppl launch] {shown}");
    let child = Command::new(path)
        .args(&argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let status = supervise(child)?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
