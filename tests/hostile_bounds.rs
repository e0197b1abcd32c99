//! Hostile input, second round (issue 24), part two: unbounded memory and hangs (each run
//! under a time limit, its own peak RSS measured with `wait4`), ledger records that are
//! impossible, and what failed or interrupted runs leave behind.

mod common;
#[path = "hostile_util/mod.rs"]
mod util;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use util::{eval, small_text};

const MIB: u64 = 1 << 20;

#[test]
fn too_many_local_ranks_are_refused_before_any_rank_exists() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let o = eval(&common::model(), &text, &["--ranks", "1000"], 20);
    o.refused(&["1000 local ranks", "--oversubscribe", "MPI processes"]);
    assert!(o.elapsed.as_secs() < 10, "{:?}", o.elapsed);
    // It took 23.7 GB before the OOM killer; now only the model's header is read.
    assert!(o.max_rss < 400 * MIB, "peak RSS {} MiB", o.max_rss / MIB);

    // `ppl compare` builds its local ranks the same way.
    let m = common::model();
    let o = util::ppl(
        &[
            "compare",
            "--base",
            m.to_str().unwrap(),
            "--model",
            m.to_str().unwrap(),
            "--data",
            text.to_str().unwrap(),
            "--ranks",
            "1000",
        ],
        20,
    );
    o.refused(&["1000 local ranks", "--oversubscribe"]);
    assert!(o.max_rss < 400 * MIB, "peak RSS {} MiB", o.max_rss / MIB);
}

#[test]
fn mesh_degrees_are_checked_against_the_model_before_per_rank_state() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let cases: [(&[&str], &str); 3] = [
        (&["--pp", "1000"], "exceeds the model's 30 layers"),
        (&["--tp", "1000"], "--tp"),
        // Not a model limit: the rank bound refuses it.
        (&["--dp-shard", "1000"], "--oversubscribe"),
    ];
    for (args, expected) in cases {
        let o = eval(&common::model(), &text, args, 20);
        o.refused(&[expected]);
        assert!(o.elapsed.as_secs() < 10, "{args:?}: {:?}", o.elapsed);
        assert!(
            o.max_rss < 400 * MIB,
            "{args:?}: peak RSS {} MiB",
            o.max_rss / MIB
        );
    }
}

/// `levels` levels of ten aliases each to the level below ("billion laughs").
fn laughs(levels: usize) -> String {
    let mut s = "model: {path: m.gguf}\nx0: &x0 [lol, lol]\n".to_string();
    for l in 1..=levels {
        let refs = vec![format!("*x{}", l - 1); 10].join(",");
        s += &format!("x{l}: &x{l} [{refs}]\n");
    }
    s
}

#[test]
fn yaml_alias_bombs_and_deep_nesting_are_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let bomb = dir.path().join("bomb.yaml");
    std::fs::write(&bomb, laughs(9)).unwrap();
    assert!(std::fs::metadata(&bomb).unwrap().len() < 500);
    let deep = dir.path().join("deep.yaml");
    std::fs::write(&deep, format!("data:\n  {}x\n", "- ".repeat(100_000))).unwrap();
    for (file, expected) in [
        (&bomb, "aliases expand to more than"),
        (&deep, "nested more than"),
    ] {
        let f = file.to_str().unwrap();
        for args in [
            vec!["config", "show", "--config", f],
            vec![
                "eval",
                "--config",
                f,
                "-m",
                common::model().to_str().unwrap(),
                "-f",
                text.to_str().unwrap(),
            ],
        ] {
            let o = util::ppl(&args.iter().map(|s| &**s).collect::<Vec<_>>(), 20);
            o.refused(&[f, expected]);
            assert!(o.elapsed.as_secs() < 5, "{:?}", o.elapsed);
            assert!(o.max_rss < 200 * MIB, "peak RSS {} MiB", o.max_rss / MIB);
        }
    }
}

#[test]
fn ppl_report_reads_only_regular_results_files_of_a_known_schema() {
    let dir = tempfile::tempdir().unwrap();
    // /dev/zero was read until the OOM killer (24.2 GB).
    let o = util::ppl(&["report", "/dev/zero", "--format", "txt"], 10);
    o.refused(&["/dev/zero is a character device", "not a results file"]);
    assert!(o.max_rss < 200 * MIB);
    // A FIFO: refused by its type, without blocking on open.
    let fifo = dir.path().join("pipe.json");
    mkfifo(&fifo);
    let o = util::ppl(&["report", fifo.to_str().unwrap(), "--format", "txt"], 10);
    o.refused(&["is a FIFO (named pipe)"]);
    // A sparse 300 MB file: refused by its size before a byte is read.
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 * MIB)
        .unwrap();
    let o = util::ppl(&["report", big.to_str().unwrap(), "--format", "txt"], 10);
    o.refused(&["300 MiB", "larger than any ppl results file"]);
    assert!(o.max_rss < 200 * MIB, "peak RSS {} MiB", o.max_rss / MIB);
    // An unknown schema version is refused, not read silently.
    let future = dir.path().join("future.json");
    std::fs::write(&future, r#"{"schema_version": 99, "ppl": 1.0}"#).unwrap();
    let o = util::ppl(&["report", future.to_str().unwrap(), "--format", "txt"], 10);
    o.refused(&["schema_version 99", "reads version 1"]);
    assert!(!dir.path().join("future.html").exists());
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_or_socket_as_model_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let fifo = dir.path().join("model.gguf");
    mkfifo(&fifo);
    // It blocked forever in open(); the limit would kill it (and fail the exit-code check).
    let o = eval(&fifo, &text, &[], 10);
    o.refused(&["is a FIFO (named pipe), not a model file", "--model takes"]);
    assert!(!o.timed_out);
    let sock = dir.path().join("model.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let o = eval(&sock, &text, &[], 10);
    o.refused(&["is a socket, not a model file"]);
    // Data: a device reads without end and is refused too.
    let o = eval(&common::model(), Path::new("/dev/zero"), &[], 10);
    o.refused(&["--data /dev/zero is a character device"]);
    assert!(o.max_rss < 400 * MIB);
}

/// Wikitext-2 as one line of at least `bytes` bytes (newlines become spaces).
fn one_line(bytes: usize) -> String {
    let text = std::fs::read_to_string(common::wikitext()).unwrap();
    let line: String = text
        .chars()
        .map(|c| if c == '\n' { ' ' } else { c })
        .collect();
    let mut s = String::with_capacity(bytes + line.len());
    while s.len() < bytes {
        s.push_str(&line);
    }
    s
}

#[test]
fn a_huge_single_line_is_tokenized_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let text = one_line(6 << 20);
    let path = dir.path().join("one-line.txt");
    std::fs::write(&path, &text).unwrap();
    let o = eval(&common::model(), &path, &[], 120);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    eprintln!(
        "{} MiB on one line: peak RSS {} MiB, {:.1} s",
        text.len() as u64 / MIB,
        o.max_rss / MIB,
        o.elapsed.as_secs_f64()
    );
    // 115 bytes per input byte before (690 MiB here); the pieces keep it near the text,
    // its ids and the model.
    assert!(
        o.max_rss < 400 * MIB,
        "peak RSS {} MiB for a {} MiB line",
        o.max_rss / MIB,
        text.len() as u64 / MIB
    );
}

#[test]
fn a_single_line_cut_into_pieces_gives_the_same_ids() {
    use std::str::FromStr;
    let g = ppl::model::GgufFile::open(&common::model()).unwrap();
    let tok = ppl::tokenize::Tokenizer::from_gguf(&g).unwrap();
    let whole = tokenizers::Tokenizer::from_str(&tok.hf_json().unwrap()).unwrap();
    let line = one_line(400_000);
    let end = (0..=400_000)
        .rev()
        .find(|&i| line.is_char_boundary(i))
        .unwrap();
    let text = &line[..end];
    let expected = whole.encode_fast(text, false).unwrap().get_ids().to_vec();
    assert_eq!(tok.encode_plain(text).unwrap(), expected);
}

/// Rewrites every window record of every ledger in `dir` with `edit` (keeping valid CRCs).
fn edit_ledgers(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    for path in ppl::eval::ledger::files(dir).unwrap() {
        let bytes = std::fs::read(&path).unwrap();
        let mut out = bytes[..8].to_vec();
        let mut pos = 8;
        let mut first = true;
        while pos + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            let payload = &bytes[pos + 8..pos + 8 + len];
            let payload = if first {
                payload.to_vec()
            } else {
                let mut v: serde_json::Value = serde_json::from_slice(payload).unwrap();
                edit(&mut v);
                serde_json::to_vec(&v).unwrap()
            };
            first = false;
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            out.extend_from_slice(&payload);
            pos += 8 + len;
        }
        std::fs::write(&path, out).unwrap();
    }
}

#[test]
fn impossible_ledger_records_are_refused_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("0 scored tokens", |v| v["acc"]["count"] = 0.into()),
        ("a negative NLL sum", |v| {
            v["acc"]["sum"] = "-100000000000000000000".into()
        }),
        ("sum of squares", |v| v["acc"]["sum_sq"] = "1".into()),
    ];
    for (expected, edit) in edits {
        let run = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(util::ppl_bin());
        cmd.arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(&text)
            .args([
                "--ctx",
                "64",
                "--chunks",
                "2",
                "--progress",
                "none",
                "--run-dir",
            ])
            .arg(run.path());
        let o = util::run_bounded(cmd, None, Duration::from_secs(60));
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        edit_ledgers(run.path(), edit);
        let out = dir.path().join("resumed.json");
        let o = util::ppl(
            &[
                "eval",
                "--resume",
                run.path().to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--progress",
                "none",
            ],
            60,
        );
        o.refused(&["is impossible", expected, "although its checksum is valid"]);
        assert!(!out.exists());
    }
}

#[test]
fn failed_starts_leave_no_run_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let text = small_text(cwd.path());
    let short = cwd.path().join("short.txt");
    std::fs::write(&short, "Just a few words.").unwrap();
    for (data, args, expected) in [
        (
            &text,
            vec!["--ctx", "100000"],
            "exceeds the model's context length",
        ),
        (
            &short,
            vec!["--ctx", "64"],
            "fewer than the 64 one window needs",
        ),
        (
            &text,
            vec!["--ctx", "64", "--ranks", "2", "--tp", "2"],
            "KV heads",
        ),
    ] {
        let mut cmd = Command::new(util::ppl_bin());
        cmd.current_dir(cwd.path())
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(data)
            .args(["--progress", "none"])
            .args(&args);
        let o = util::run_bounded(cmd, None, Duration::from_secs(30));
        o.refused(&[expected]);
        assert!(
            !cwd.path().join("runs").exists(),
            "{args:?} left {:?}",
            util::entries(&cwd.path().join("runs"))
        );
    }
}

fn spools(tmp: &Path) -> Vec<String> {
    util::entries(tmp)
        .into_iter()
        .filter(|n| n.starts_with("ppl-stdin-"))
        .collect()
}

#[test]
fn the_stdin_spool_is_removed_after_success_error_and_ctrl_c() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read(common::wikitext()).unwrap();
    let cmd = |extra: &[&str]| {
        let mut c = Command::new(util::ppl_bin());
        c.current_dir(cwd.path())
            .env("TMPDIR", tmp.path())
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .args(["--data", "-", "--ctx", "64", "--progress", "none"])
            .args(extra);
        c
    };
    let o = util::run_bounded(
        cmd(&["--chunks", "1"]),
        Some(&text[..20_000]),
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(spools(tmp.path()).is_empty(), "after success");
    let o = util::run_bounded(cmd(&[]), Some(b"Too short."), Duration::from_secs(60));
    o.refused(&["fewer than the 64"]);
    assert!(spools(tmp.path()).is_empty(), "after an error");

    // Ctrl-C in the middle of a long run.
    let input = tmp.path().join("input.txt");
    std::fs::write(&input, &text).unwrap();
    let mut c = cmd(&[]);
    c.stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Reaped by `wait4` in `wait_with_limit`, which `Child` cannot see.
    #[allow(clippy::zombie_processes)]
    let child = c.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let started = std::time::Instant::now();
    while spools(tmp.path()).is_empty() {
        assert!(started.elapsed().as_secs() < 30, "no spool appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let (status, _, timed_out) = util::wait_with_limit(pid, started, Duration::from_secs(60));
    assert!(!timed_out);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 130);
    assert!(spools(tmp.path()).is_empty(), "after Ctrl-C");
}
