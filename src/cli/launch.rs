//! `ppl launch`: torchrun-style flags turned into an `mpirun` command line.
//!
//! `ppl launch --nproc-per-node 4 --hosts h1,h2 -- eval --model m.gguf --data t.txt` runs
//! `mpirun -np 8 --host h1:4,h2:4 [--bind-to none] <this ppl> eval …`; `--dry-run` prints it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

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
    /// The mpirun executable.
    #[arg(long, default_value = "mpirun")]
    mpirun: String,
    /// Extra arguments for mpirun (repeatable), e.g. --mpirun-arg=--oversubscribe.
    #[arg(long = "mpirun-arg", allow_hyphen_values = true)]
    mpirun_args: Vec<String>,
    /// Print the command instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// The ppl command to run on every rank (after `--`), e.g. `eval --model … --data …`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
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
    }
    out.extend(args.mpirun_args.iter().cloned());
    out.push(exe.display().to_string());
    out.extend(args.command.iter().cloned());
    Ok(out)
}

pub fn run(args: LaunchArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot locate the ppl executable")?;
    let mpirun = which(&args.mpirun);
    let open_mpi = match &mpirun {
        Some(m) => Command::new(m)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
            .unwrap_or(false),
        None => true,
    };
    let argv = mpirun_args(&args, &exe, open_mpi)?;
    let shown = std::iter::once(args.mpirun.clone())
        .chain(argv.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    if args.dry_run {
        println!("{shown}");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(mpirun) = mpirun else {
        bail!(
            "'{}' was not found on PATH: install an MPI launcher (OpenMPI: apt-get install openmpi-bin; or MPICH), \
             build ppl with --features mpi, or pass --mpirun /path/to/mpirun",
            args.mpirun
        );
    };
    eprintln!("[ppl launch] {shown}");
    let status = Command::new(mpirun)
        .args(&argv)
        .status()
        .with_context(|| format!("cannot start {}", args.mpirun))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
