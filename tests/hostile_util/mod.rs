//! Helpers for the hostile-input tests: running `ppl` with a time limit while measuring the
//! child's own peak RSS (`wait4`), and crafting broken copies of the test model.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a bounded run of `ppl` did.
pub struct Outcome {
    /// Exit code; `None` when killed by a signal (or by the time limit).
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The child's peak resident set, in bytes (`ru_maxrss` of this child alone).
    pub max_rss: u64,
    pub timed_out: bool,
}

impl Outcome {
    /// Asserts a clean refusal: exit 1, every `expected` fragment on stderr, no panic.
    pub fn refused(&self, expected: &[&str]) {
        assert_eq!(
            self.code,
            Some(1),
            "expected exit 1 (timed out: {}), stderr:\n{}",
            self.timed_out,
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        for e in expected {
            assert!(
                self.stderr.contains(e),
                "stderr lacks {e:?}:\n{}",
                self.stderr
            );
        }
    }
}

pub fn ppl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ppl"))
}

/// Runs `cmd` (stdout and stderr to files, stdin from `stdin`), killing it after `limit`.
pub fn run_bounded(mut cmd: Command, stdin: Option<&[u8]>, limit: Duration) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (out_p, err_p) = (dir.path().join("out"), dir.path().join("err"));
    cmd.stdout(std::fs::File::create(&out_p).unwrap())
        .stderr(std::fs::File::create(&err_p).unwrap());
    let in_p = dir.path().join("in");
    match stdin {
        Some(bytes) => {
            std::fs::write(&in_p, bytes).unwrap();
            cmd.stdin(std::fs::File::open(&in_p).unwrap());
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let started = Instant::now();
    // Reaped by `wait4` in `wait_with_limit` (for its rusage), which `Child` cannot see.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("ppl starts");
    let pid = child.id() as libc::pid_t;
    let (status, rusage, timed_out) = wait_with_limit(pid, started, limit);
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Outcome {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        stdout: read(&out_p),
        stderr: read(&err_p),
        elapsed: started.elapsed(),
        max_rss: rusage.ru_maxrss as u64 * 1024,
        timed_out,
    }
}

/// Polls `wait4` on `pid` (so the rusage is this child's alone); SIGKILL after `limit`.
pub fn wait_with_limit(
    pid: libc::pid_t,
    started: Instant,
    limit: Duration,
) -> (libc::c_int, libc::rusage, bool) {
    let mut timed_out = false;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain-data out-parameters for wait4(2).
        let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut rusage) };
        if r == pid {
            return (status, rusage, timed_out);
        }
        assert!(r >= 0, "wait4 failed");
        if !timed_out && started.elapsed() > limit {
            // SAFETY: signals our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            timed_out = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ppl ARGS`, bounded.
pub fn ppl(args: &[&str], limit_s: u64) -> Outcome {
    let mut cmd = Command::new(ppl_bin());
    cmd.args(args);
    run_bounded(cmd, None, Duration::from_secs(limit_s))
}

/// `ppl eval --model MODEL --data DATA --ctx 64 --chunks 1 --progress none ARGS`, bounded.
pub fn eval(model: &Path, data: &Path, args: &[&str], limit_s: u64) -> Outcome {
    let mut cmd = Command::new(ppl_bin());
    cmd.arg("eval")
        .arg("--model")
        .arg(model)
        .arg("--data")
        .arg(data)
        .args(["--ctx", "64", "--chunks", "1", "--progress", "none"])
        .args(args);
    run_bounded(cmd, None, Duration::from_secs(limit_s))
}

/// The bytes of `data` of tensor `name` in the GGUF file at `path`: (offset, size, type name).
pub fn tensor_span(path: &Path, name: &str) -> (usize, usize, String) {
    let g = ppl::model::GgufFile::open(path).unwrap();
    let t = &g.tensors[name];
    (
        t.offset as usize,
        t.size as usize,
        ppl::model::gguf::ggml_type_name(t.type_id),
    )
}

/// Replaces the first occurrence of `from` in `bytes` by `to` (same length).
pub fn patch(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let pos = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(from)));
    bytes[pos..pos + to.len()].copy_from_slice(to);
}

/// GGUF string key followed by a u32 value: `len, key, type 4 (u32), value`.
pub fn u32_entry(key: &str, value: u32) -> Vec<u8> {
    let mut v = (key.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(key.as_bytes());
    v.extend_from_slice(&4u32.to_le_bytes());
    v.extend_from_slice(&value.to_le_bytes());
    v
}

/// A copy of the test model in `dir` under `name`, changed by `edit`.
pub fn model_copy(dir: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(crate::common::model()).unwrap();
    edit(&mut bytes);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A small UTF-8 text (the start of wikitext-2) in `dir`.
pub fn small_text(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(crate::common::wikitext()).unwrap();
    let p = dir.join("text.txt");
    std::fs::write(&p, &text[..20_000]).unwrap();
    p
}

/// Files directly in `dir`.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
