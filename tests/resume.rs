//! The run ledger and `--resume`: a run killed with SIGKILL resumes to the uninterrupted bits
//! (also on another world size or mesh), a torn ledger tail is dropped and recomputed, a
//! foreign ledger is refused, and a crashing rank ends the run at once with its ledger intact.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ppl::eval::ledger;
use ppl::report::Results;

/// ctx 128, 24 windows, f32: a few seconds of work, long enough to kill mid-run.
const WORKLOAD: [&str; 6] = ["--ctx", "128", "--chunks", "24", "--precision", "f32"];

/// The workload with another window count.
fn workload(chunks: &'static str) -> [&'static str; 6] {
    ["--ctx", "128", "--chunks", chunks, "--precision", "f32"]
}

fn ppl() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("ppl"))
}

fn eval_cmd(run_dir: &Path, extra: &[&str]) -> Command {
    eval_cmd_with(run_dir, &WORKLOAD, extra)
}

fn eval_cmd_with(run_dir: &Path, work: &[&str], extra: &[&str]) -> Command {
    let mut c = ppl();
    c.arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(work)
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--progress", "none"])
        .args(extra);
    c
}

/// Records in every ledger of `dir`.
fn ledger_records(dir: &Path) -> usize {
    ledger::files(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| ledger::parse(p, &std::fs::read(p).ok()?).ok())
        .map(|c| c.records.len())
        .sum()
}

/// Starts a run and SIGKILLs it once its ledgers hold at least `n` records; returns the count
/// seen just before the kill.
fn kill_after(mut child: Child, dir: &Path, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let seen = ledger_records(dir);
        if seen >= n {
            child.kill().unwrap();
            child.wait().unwrap();
            return seen;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the run ended ({st}) before it could be killed");
        }
        assert!(Instant::now() < deadline, "no ledger records appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn resume(dir: &Path, out: &Path, extra: &[&str]) -> Results {
    let st = ppl()
        .args(["eval", "--resume"])
        .arg(dir)
        .args(["--progress", "none", "--output"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "resume failed: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

#[test]
fn a_killed_run_resumes_to_the_uninterrupted_bits() {
    let base = common::eval(&WORKLOAD);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let out = tmp.path().join("killed.json");
    let child = eval_cmd(&dir, &["--output"])
        .arg(&out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = kill_after(child, &dir, 5);
    assert!(!out.exists(), "a killed run must not leave a results file");
    // The configuration was saved: `--resume DIR` alone restarts it.
    assert!(dir.join("config.yaml").is_file());
    let r = resume(&dir, &tmp.path().join("resumed.json"), &[]);
    common::assert_same_numbers(&base, &r);
    let run = r.run.expect("run info");
    assert!(run.resumed);
    assert_eq!(run.attempt, 1);
    // Every record written before the kill was kept: only the windows in flight (and those
    // not started) were recomputed.
    assert!(
        run.windows_from_ledger >= seen,
        "{} from the ledger, {seen} seen before the kill",
        run.windows_from_ledger
    );
    assert!(run.windows_from_ledger < 24);
}

#[test]
fn a_resume_may_use_another_world_size_or_mesh() {
    let base = common::eval(&WORKLOAD);
    let tmp = tempfile::tempdir().unwrap();
    for (i, extra) in [
        &["--ranks", "3", "--schedule", "dynamic"][..],
        &["--ranks", "2", "--pp", "2"][..],
    ]
    .iter()
    .enumerate()
    {
        let dir = tmp.path().join(format!("run{i}"));
        let child = eval_cmd(&dir, &["--ranks", "2"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        kill_after(child, &dir, 4);
        let r = resume(&dir, &tmp.path().join(format!("r{i}.json")), extra);
        common::assert_same_numbers(&base, &r);
        assert!(r.run.unwrap().windows_from_ledger >= 4);
    }
}

#[test]
fn a_torn_ledger_tail_is_dropped_and_its_window_recomputed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let st = eval_cmd_with(&dir, &workload("6"), &[]).output().unwrap();
    assert!(st.status.success());
    // Cut the (only) ledger in the middle of its last record, as a crash mid-write would.
    let files = ledger::files(&dir).unwrap();
    assert_eq!(files.len(), 1);
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() - 30]).unwrap();
    let r = resume(&dir, &tmp.path().join("r.json"), &[]);
    let six = common::eval(&workload("6"));
    common::assert_same_numbers(&six, &r);
    let run = r.run.unwrap();
    assert_eq!(run.windows_from_ledger, 5);
    assert_eq!(run.ledger_notes.len(), 1, "{:?}", run.ledger_notes);
    assert!(run.ledger_notes[0].contains("dropped a torn or corrupt tail"));
}

#[test]
fn a_foreign_ledger_is_refused_with_what_differs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let st = eval_cmd_with(&dir, &workload("2"), &[]).output().unwrap();
    assert!(st.status.success());
    let other = tmp.path().join("other.txt");
    let mut text = std::fs::read_to_string(common::wikitext()).unwrap();
    text.insert_str(0, "A different first line.\n");
    std::fs::write(&other, text).unwrap();
    let out = tmp.path().join("r.json");
    let st = ppl()
        .args(["eval", "--resume"])
        .arg(&dir)
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(&other)
        .args(["--ctx", "128", "--chunks", "2", "--precision", "f32"])
        .args(["--progress", "none", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success());
    assert!(
        stderr.contains("belongs to a different evaluation") && stderr.contains("data sha256"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out.exists());
    // Not a run directory at all.
    let st = ppl()
        .args(["eval", "--resume"])
        .arg(tmp.path().join("nowhere"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    assert!(String::from_utf8_lossy(&st.stderr).contains("no such directory"));
}

#[test]
fn a_crashing_rank_ends_the_run_at_once_and_names_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let out = tmp.path().join("r.json");
    let started = Instant::now();
    let st = eval_cmd(&dir, &["--ranks", "2", "--output"])
        .arg(&out)
        .env("PPL_DEBUG_PANIC_RANK", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success());
    assert!(
        stderr.contains("rank 1 (") && stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(stderr.contains("--resume"), "{stderr}");
    // Not the 600 s communication timeout: the other rank was told.
    assert!(started.elapsed() < Duration::from_secs(120));
    assert!(!out.exists());
    // Rank 0's ledger is intact and readable.
    let files = ledger::files(&dir).unwrap();
    assert!(!files.is_empty());
    for f in files {
        let c = ledger::parse(&f, &std::fs::read(&f).unwrap()).unwrap();
        assert_eq!(c.dropped_bytes, 0);
    }
}
