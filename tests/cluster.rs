//! Multi-host runs over a real network stack: a cluster of network-namespace hosts on this
//! machine (`scripts/cluster.sh`), each with its own hostname and memory cgroup, ppl launched
//! across them by `ppl launch` with Open MPI over TCP only.
//!
//! - Every layout (dp, pp, dp_shard, tp, dp_replicate × pp) on 2 and 3 hosts gives the numbers of
//!   one process (tp: of the one-host tp run), and results.json names every host.
//! - A model too big for one host's memory limit is refused there with the remedy, then runs
//!   with that remedy across two hosts, each host's peak under its limit.
//! - A link cut or a host killed mid-run ends the whole job (every rank and the launcher) within
//!   `PPL_COMM_TIMEOUT` + 30 s with the lost rank, its host and the `--resume` command named; the
//!   resume, on the healed cluster or on one host, gives the uninterrupted run's numbers.
//!
//! The tests need root, iproute2 and Open MPI, and the `mpi` feature; where namespaces cannot be
//! made they say so and pass without running.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_same_numbers, model, wikitext};
use ppl::report::Results;

/// Cluster tests share the machine's namespaces and cgroups: one at a time.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

const PREFIX: &str = "pplt";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh")
}

fn ppl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ppl"))
}

/// A cluster of `n` hosts, removed when dropped.
struct Cluster {
    _lock: std::sync::MutexGuard<'static, ()>,
}

/// `cluster.sh ARGS…` for this test binary's cluster.
fn cluster_cmd(args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg(script())
        .args(args)
        .env("PPL_CLUSTER_PREFIX", PREFIX)
        .env("PPL_BIN", ppl_bin())
        .stdin(Stdio::null());
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("bash runs")
}

/// Why this machine cannot run the cluster tests, if it cannot.
fn unavailable() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some("ppl was built without the mpi feature".into());
    }
    let found = |cmd: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    for cmd in ["ip", "mpirun", "nsenter", "unshare"] {
        if !found(cmd) {
            return Some(format!("'{cmd}' is not installed"));
        }
    }
    None
}

impl Cluster {
    /// `n` hosts (each limited to `mem` if given), or `None` with the reason printed.
    fn up(n: usize, mem: Option<&str>) -> Option<Cluster> {
        let lock = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = unavailable() {
            // CI sets PPL_REQUIRE_CLUSTER: there a skip would hide a failure.
            assert!(
                std::env::var_os("PPL_REQUIRE_CLUSTER").is_none(),
                "PPL_REQUIRE_CLUSTER is set but cluster tests need {why}"
            );
            eprintln!("SKIPPED: cluster tests need {why}");
            return None;
        }
        let n = n.to_string();
        let mut args = vec!["up", n.as_str()];
        if let Some(m) = mem {
            args.extend(["--mem", m]);
        }
        let out = run(cluster_cmd(&args));
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // Only a machine that cannot make namespaces is a reason to skip.
            let cannot = ["Operation not permitted", "needs root", "Permission denied"];
            assert!(
                cannot.iter().any(|c| err.contains(c))
                    && std::env::var_os("PPL_REQUIRE_CLUSTER").is_none(),
                "cluster.sh up failed: {err}"
            );
            eprintln!("SKIPPED: network namespaces cannot be made here: {err}");
            run(cluster_cmd(&["down"]));
            return None;
        }
        Some(Cluster { _lock: lock })
    }

    fn control(&self, args: &[&str]) {
        let out = run(cluster_cmd(args));
        assert!(
            out.status.success(),
            "cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ppl launch` across the first `hosts` hosts, `per_host` ranks each.
    fn launch_cmd(&self, hosts: usize, per_host: usize, ppl_args: &[&str]) -> Command {
        let (h, k) = (hosts.to_string(), per_host.to_string());
        let mut c = cluster_cmd(&["launch", "--hosts", &h, "--per-host", &k, "--"]);
        c.args(ppl_args);
        c
    }

    /// `ppl eval` across the cluster on the test model and data; the parsed results.
    fn eval(&self, hosts: usize, per_host: usize, args: &[&str]) -> Results {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let run_dir = dir.path().join("run");
        let mut full: Vec<String> = ["eval", "--model"].map(String::from).to_vec();
        full.push(model().display().to_string());
        full.push("--data".into());
        full.push(wikitext().display().to_string());
        full.extend(args.iter().map(|s| s.to_string()));
        full.extend(["--progress", "none", "--quiet", "--output"].map(String::from));
        full.push(out.display().to_string());
        full.push("--run-dir".into());
        full.push(run_dir.display().to_string());
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let o = run(self.launch_cmd(hosts, per_host, &refs));
        assert!(
            o.status.success(),
            "cluster eval {args:?} on {hosts} hosts × {per_host} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
    }

    /// ppl processes still running on host `i`.
    fn ppl_processes(&self, i: usize) -> usize {
        let pids = run({
            let mut c = Command::new("ip");
            c.args(["netns", "pids", &format!("{PREFIX}-h{i}")]);
            c
        });
        String::from_utf8_lossy(&pids.stdout)
            .split_whitespace()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "ppl")
            })
            .count()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        run(cluster_cmd(&["down"]));
    }
}

/// The hosts results.json names, sorted and deduplicated.
fn hosts_of(r: &Results) -> Vec<String> {
    let mut h: Vec<String> = match &r.mesh {
        Some(m) => m.ranks.iter().map(|r| r.host.clone()).collect(),
        None => r.ranks.iter().map(|r| r.host.clone()).collect(),
    };
    h.sort();
    h.dedup();
    h
}

fn host_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{PREFIX}-h{i}")).collect()
}

const SMALL: [&str; 4] = ["--ctx", "128", "--chunks", "6"];

fn with(extra: &[&str]) -> Vec<&'static str> {
    SMALL
        .iter()
        .chain(extra)
        .map(|s| -> &'static str { Box::leak(s.to_string().into_boxed_str()) })
        .collect()
}

#[test]
fn every_layout_across_hosts_gives_the_numbers_of_one_process() {
    let Some(c) = Cluster::up(3, None) else {
        return;
    };
    let one = common::eval(&with(&[]));
    for (hosts, per_host, layout) in [
        (2, 1, &[][..]),
        (2, 1, &["--pp", "2"][..]),
        (2, 1, &["--dp-shard", "2"][..]),
        (3, 1, &[][..]),
        (2, 2, &["--dp-replicate", "2", "--pp", "2"][..]),
    ] {
        let r = c.eval(hosts, per_host, &with(layout));
        assert_same_numbers(&one, &r);
        assert_eq!(hosts_of(&r), host_names(hosts), "{layout:?}");
        assert_eq!(r.world.backend, "mpi");
    }
    // Tensor parallelism sums partial products in another order: the same bits as one host's
    // tp run, not as one rank's.
    let tp_local = common::eval(&with(&["--ranks", "3", "--tp", "3"]));
    let tp = c.eval(3, 1, &with(&["--tp", "3"]));
    assert_same_numbers(&tp_local, &tp);
    assert_eq!(hosts_of(&tp), host_names(3));
    // The HTML report names the hosts too.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tp.json");
    std::fs::write(&json, serde_json::to_vec(&tp).unwrap()).unwrap();
    let html = dir.path().join("tp.html");
    common::ppl_cmd()
        .arg("report")
        .arg(&json)
        .arg("-o")
        .arg(&html)
        .assert()
        .success();
    let page = std::fs::read_to_string(&html).unwrap();
    for h in host_names(3) {
        assert!(page.contains(&h), "the report does not name {h}");
    }
}

#[test]
fn a_model_too_big_for_one_host_runs_split_over_two() {
    // f32 weights of the test model: about 600 MiB planned for one process, 420 MiB for the
    // larger of two pipeline stages (measured peak about 400 MiB).
    let limit_mib = 500u64;
    let Some(c) = Cluster::up(2, Some(&format!("{limit_mib}M"))) else {
        return;
    };
    let args = with(&["--precision", "f32"]);
    let refused = run({
        let mut cmd = cluster_cmd(&["exec", "1", "--"]);
        cmd.arg(ppl_bin())
            .args(["eval", "--model"])
            .arg(model())
            .arg("--data")
            .arg(wikitext())
            .args(&args)
            .args(["--progress", "none"]);
        cmd
    });
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("not enough memory"), "{err}");
    assert!(
        err.contains(&format!("{PREFIX}-h1")),
        "names the cgroup: {err}"
    );
    assert!(
        err.contains("--pp 2 over two nodes, one rank each (same result)")
            && err
                .lines()
                .any(|l| l.contains("--pp 2") && l.contains("(fits)")),
        "{err}"
    );
    let unlimited = common::eval(&args);
    let split = c.eval(2, 1, &with(&["--precision", "f32", "--pp", "2"]));
    assert_same_numbers(&unlimited, &split);
    let mesh = split
        .mesh
        .as_ref()
        .expect("a pipeline run reports its mesh");
    for r in &mesh.ranks {
        let peak = r.peak_rss_bytes.expect("MPI ranks measure their peak");
        assert!(
            peak < limit_mib << 20,
            "rank {} on {}: peak {peak} bytes",
            r.rank,
            r.host
        );
    }
}

/// What a failure mid-run must leave: the job ended in time with the peer and the resume
/// command named, and a resume — on the cluster and on one host — equal to the uninterrupted
/// run.
struct Failure<'a> {
    cluster: &'a Cluster,
    /// Breaks host 2 (cut its link, or kill it).
    inflict: &'a dyn Fn(&Cluster),
    /// Restores the cluster for the resume.
    repair: &'a dyn Fn(&Cluster),
    /// Whether ppl itself sees the failure (a silent peer) and names it. A killed host is seen
    /// first by Open MPI, whose daemon there died: it ends the job at once and ppl's ranks only
    /// say how to resume.
    names_the_peer: bool,
}

const TIMEOUT_S: u64 = 10;

impl Failure<'_> {
    fn check(&self, args: &[&str]) {
        let c = self.cluster;
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let mut full: Vec<String> = vec!["eval".into(), "--model".into()];
        full.push(model().display().to_string());
        full.push("--data".into());
        full.push(wikitext().display().to_string());
        full.extend(args.iter().map(|s| s.to_string()));
        full.extend(["--progress", "none", "--run-dir"].map(String::from));
        full.push(run_dir.display().to_string());
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let mut launch = c.launch_cmd(2, 1, &refs);
        launch
            .env("PPL_COMM_TIMEOUT", TIMEOUT_S.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = launch.spawn().unwrap();
        // Break host 2 once a window is recorded (a ledger holds a record: a header alone, or
        // a second rank's header appearing late, is not one).
        let started = Instant::now();
        while ledger_records(&run_dir) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no window finished"
            );
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            std::thread::sleep(Duration::from_millis(200));
        }
        (self.inflict)(c);
        let broken = Instant::now();
        let bound = Duration::from_secs(TIMEOUT_S + 30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                broken.elapsed() < bound + Duration::from_secs(60),
                "the launcher still runs"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let ended = broken.elapsed();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!status.success());
        assert!(
            ended <= bound,
            "the job ended {ended:?} after the failure: {err}"
        );
        if self.names_the_peer {
            // ppl's own timeout names the rank and its host; when Open MPI's daemons notice the
            // lost host first (their keepalive), its message names the host's address.
            let by_ppl = err.contains(&format!("rank 1 ({PREFIX}-h2)"));
            let by_mpi = err.contains("lost communication with a remote daemon")
                && err.contains("10.250.0.2");
            assert!(by_ppl || by_mpi, "names the lost host: {err}");
            eprintln!(
                "the lost host was named by {}",
                if by_ppl { "ppl" } else { "Open MPI" }
            );
        }
        assert!(
            err.contains(&format!("ppl eval --resume {}", run_dir.display())),
            "gives the resume command: {err}"
        );
        // Every rank has ended too (the one cut off as well) by the bound.
        while broken.elapsed() < bound && (1..=2).any(|h| c.ppl_processes(h) > 0) {
            std::thread::sleep(Duration::from_millis(200));
        }
        for h in 1..=2 {
            assert_eq!(c.ppl_processes(h), 0, "ppl still runs on host {h}");
        }
        // Resume on one host (a copy of the run directory), then on the repaired cluster.
        let copy = dir.path().join("copy");
        copy_dir(&run_dir, &copy);
        let uninterrupted = common::eval(args);
        let single = common::eval_resume(&copy);
        assert_same_numbers(&uninterrupted, &single);
        (self.repair)(c);
        let out = dir.path().join("resumed.json");
        let resume = [
            "eval",
            "--resume",
            run_dir.to_str().unwrap(),
            "--progress",
            "none",
            "--quiet",
            "--output",
            out.to_str().unwrap(),
        ];
        // Right after a heal, Open MPI's daemon on the healed host may fail to start (its
        // first connection races the link coming back): that is the launcher's start-up, not
        // the resume under test, so it is retried a few times.
        let mut o = run(c.launch_cmd(2, 1, &resume));
        for _ in 0..3 {
            let err = String::from_utf8_lossy(&o.stderr);
            if o.status.success() || !err.contains("ORTE was unable to reliably start") {
                break;
            }
            std::thread::sleep(Duration::from_secs(3));
            o = run(c.launch_cmd(2, 1, &resume));
        }
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let resumed: Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_same_numbers(&uninterrupted, &resumed);
        let run_info = resumed.run.expect("a resumed run says so");
        assert!(run_info.resumed && run_info.windows_from_ledger > 0);
        eprintln!(
            "failure ended the job in {ended:.1?}; {} of {} windows came from the ledger",
            run_info.windows_from_ledger,
            resumed.windows.len()
        );
    }
}

/// Bytes of ledger records in a run directory.
/// Windows the run directory's ledgers hold so far (torn tails ignored, as a resume does).
fn ledger_records(dir: &Path) -> usize {
    ppl::eval::ledger::files(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| {
            let bytes = std::fs::read(f).ok()?;
            ppl::eval::ledger::parse(f, &bytes).ok()
        })
        .map(|c| c.records.len())
        .sum()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

const LONG: [&str; 6] = ["--ctx", "128", "--chunks", "40", "--dp-shard", "2"];

#[test]
fn a_cut_link_ends_the_job_and_the_resume_gives_the_same_numbers() {
    let Some(c) = Cluster::up(2, None) else {
        return;
    };
    Failure {
        cluster: &c,
        inflict: &|c| c.control(&["cut", "2"]),
        // The cut-off host keeps the dead job's Open MPI daemon until TCP gives up on it;
        // a real operator's clean-up, then the link back.
        repair: &|c| {
            c.control(&["kill", "2"]);
            c.control(&["heal"]);
        },
        names_the_peer: true,
    }
    .check(&LONG);
}

#[test]
fn a_killed_host_ends_the_job_and_the_resume_gives_the_same_numbers() {
    let Some(c) = Cluster::up(2, None) else {
        return;
    };
    Failure {
        cluster: &c,
        inflict: &|c| c.control(&["kill", "2"]),
        repair: &|_| {},
        names_the_peer: false,
    }
    .check(&LONG);
}

/// `ppl validate --distributed`'s "one way X ms … Y MB/s" for a ping-pong size.
fn ping_pong(out: &str, size: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.contains(&format!("ping-pong {size}")))
        .unwrap_or_else(|| panic!("no ping-pong {size} line in:\n{out}"));
    let number_before = |unit: &str| -> f64 {
        let head = &line[..line
            .find(unit)
            .unwrap_or_else(|| panic!("no {unit} in {line}"))];
        head.split_whitespace().last().unwrap().parse().unwrap()
    };
    (number_before(" ms"), number_before(" MB/s"))
}

#[test]
fn a_slow_link_is_measured_and_changes_no_result() {
    let Some(c) = Cluster::up(2, None) else {
        return;
    };
    let slow = run(cluster_cmd(&["slow", "2", "20ms", "100mbit"]));
    let err = String::from_utf8_lossy(&slow.stderr);
    if err.contains("qdisc kind is unknown") {
        eprintln!("SKIPPED: this kernel has no netem queueing discipline (sch_netem): {err}");
        return;
    }
    assert!(slow.status.success(), "{err}");
    let validate = run(c.launch_cmd(2, 1, &["validate", "--distributed"]));
    let out = String::from_utf8_lossy(&validate.stdout);
    assert!(validate.status.success(), "{out}");
    // 20 ms each way; 100 Mbit/s is 12.5 MB/s (TCP's headers take a few percent of it).
    let (latency_ms, _) = ping_pong(&out, "1 KiB");
    assert!((latency_ms - 20.0).abs() <= 5.0, "latency {latency_ms} ms");
    let (_, rate) = ping_pong(&out, "64 MiB");
    assert!((rate - 12.5).abs() <= 0.25 * 12.5, "bandwidth {rate} MB/s");
    let one = common::eval(&with(&[]));
    let r = c.eval(2, 1, &with(&["--dp-shard", "2"]));
    assert_same_numbers(&one, &r);
    let comm_share = |r: &Results| {
        let m = r.mesh.as_ref().unwrap();
        m.ranks.iter().map(|x| x.comm_s).sum::<f64>()
            / m.ranks.iter().map(|x| x.comm_s + x.compute_s).sum::<f64>()
    };
    c.control(&["heal"]);
    let fast = c.eval(2, 1, &with(&["--dp-shard", "2"]));
    assert!(
        comm_share(&r) > comm_share(&fast),
        "communication share {} on the slow link vs {} healed",
        comm_share(&r),
        comm_share(&fast)
    );
}
