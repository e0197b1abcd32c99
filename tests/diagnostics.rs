//! Diagnostics that tell the fix: a lost rank, and a result that differs from an expected run.

mod common;

use std::time::{Duration, Instant};

use predicates::prelude::*;
use predicates::str::contains;

fn small_eval() -> assert_cmd::Command {
    let mut c = common::ppl_cmd();
    c.arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args([
            "--ctx",
            "128",
            "--chunks",
            "4",
            "--precision",
            "f32",
            "--progress",
            "none",
            "--quiet",
        ]);
    c
}

#[test]
fn a_silent_rank_ends_the_run_in_bounded_time_and_is_named() {
    let t = Instant::now();
    small_eval()
        .env("PPL_COMM_TIMEOUT", "2")
        .env("PPL_DEBUG_STALL_RANK", "1")
        .args(["--ranks", "2"])
        .assert()
        .failure()
        .code(1)
        .stderr(contains("no message from rank 1 within 2 s"))
        .stderr(contains("ppl validate --distributed"))
        .stderr(contains("panicked").not());
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

/// A follower of a split model goes silent: its leader waits for it inside the forward pass
/// (the tensor-parallel all-reduce, 3 ranks for the test model's 3 KV heads; the
/// context-parallel ring) and ends the run with the same message, in bounded time.
#[test]
fn a_silent_rank_inside_the_forward_pass_ends_the_run_in_bounded_time_and_is_named() {
    for (ranks, mesh) in [("3", ["--tp", "3"]), ("2", ["--cp", "2"])] {
        let t = Instant::now();
        small_eval()
            .env("PPL_COMM_TIMEOUT", "2")
            .env("PPL_DEBUG_STALL_RANK", "1")
            .args(["--ranks", ranks])
            .args(mesh)
            .assert()
            .failure()
            .code(1)
            // Whichever rank waited for it first reports it (under tp both others wait).
            .stderr(contains("no message from rank 1 within 2 s (rank "))
            .stderr(contains("(rank 1 waited").not())
            .stderr(contains("ppl validate --distributed"))
            .stderr(contains("panicked").not());
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{mesh:?} took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn expect_explains_a_result_outside_the_previous_interval() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.json");
    small_eval().arg("--output").arg(&first).assert().success();
    small_eval()
        .arg("--expect")
        .arg(&first)
        .assert()
        .success()
        .stderr(contains("matches the expected run bit for bit"));

    // A previous run made with another ctx and model, whose PPL and CI lie elsewhere.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    let ppl = v["ppl"].as_f64().unwrap();
    v["ppl"] = (ppl * 1.5).into();
    v["ci95"] = serde_json::json!([ppl * 1.45, ppl * 1.55]);
    v["config"]["ctx"] = 64.into();
    v["model"]["sha256"] = "0123456789abcdef".into();
    let other = dir.path().join("other.json");
    std::fs::write(&other, serde_json::to_vec(&v).unwrap()).unwrap();
    small_eval()
        .arg("--expect")
        .arg(&other)
        .assert()
        .failure()
        .code(1)
        .stderr(contains("more than its 95% CI"))
        .stderr(contains("ctx: 64 → 128"))
        .stderr(contains("model file: sha256 0123456789ab…"));
    small_eval()
        .args(["--expect", "/nonexistent/prev.json"])
        .assert()
        .failure()
        .stderr(contains("--expect: cannot read /nonexistent/prev.json"));
}
