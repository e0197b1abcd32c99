//! Data-parallel runs on the `local` backend: bit-identical results for any world size and
//! schedule, start-up agreement, and the `ppl launch` command line.

mod common;

use common::eval;
use predicates::prelude::*;
use predicates::str::contains;

/// ctx 256, 12 chunks: every rank of a 4-rank world scores 3 windows.
const WORKLOAD: [&str; 6] = ["--ctx", "256", "--chunks", "12", "--precision", "f32"];

fn with(extra: &[&str]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = WORKLOAD.to_vec();
    for e in extra {
        v.push(Box::leak(e.to_string().into_boxed_str()));
    }
    v
}

#[test]
fn world_sizes_and_schedules_give_identical_bits() {
    let base = eval(&with(&["--ranks", "1"]));
    assert_eq!(base.world.size, 1);
    for ranks in ["2", "3", "4"] {
        for schedule in ["static", "dynamic"] {
            let r = eval(&with(&[
                "--ranks",
                ranks,
                "--schedule",
                schedule,
                "--batch-size",
                "2",
            ]));
            assert_eq!(r.world.size, ranks.parse::<usize>().unwrap());
            assert_eq!(r.world.backend, "local");
            common::assert_same_numbers(&base, &r);
            // Every rank reported, and together they scored every window once.
            assert_eq!(r.ranks.len(), r.world.size);
            assert_eq!(
                r.ranks.iter().map(|s| s.windows).sum::<usize>(),
                12,
                "{:?}",
                r.ranks
            );
            assert_eq!(r.ranks.iter().map(|s| s.tokens).sum::<u64>(), r.tokens);
            if schedule == "static" {
                assert!(r.ranks.iter().all(|s| s.windows >= 3), "{:?}", r.ranks);
            }
            for s in &r.ranks {
                assert!(s.compute_s > 0.0 && s.wall_s >= s.compute_s, "{s:?}");
                assert!(
                    s.comm_s < 0.05 * s.wall_s,
                    "communication share too large: {s:?}"
                );
            }
        }
    }
}

#[test]
fn a_rank_with_a_different_data_file_stops_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.txt");
    let mut text = std::fs::read_to_string(common::wikitext()).unwrap();
    text.push_str("\nOne more line on this node only.\n");
    std::fs::write(&other, text).unwrap();
    let out = dir.path().join("r.json");
    common::ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ranks", "3", "--progress", "none", "--output"])
        .arg(&out)
        .arg(format!("--debug-rank-data=2={}", other.display()))
        .assert()
        .failure()
        .code(1)
        .stderr(contains("ranks disagree"))
        .stderr(contains("rank 2 ("))
        .stderr(contains("different data file"))
        .stderr(contains("other.txt"))
        .stderr(contains("rank 1").not())
        .stderr(contains("panicked").not());
    assert!(!out.exists());
}

#[test]
fn launch_builds_the_mpirun_command() {
    common::ppl_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "4",
            "--hosts",
            "h1,h2",
            "--dry-run",
            "--",
            "eval",
            "--model",
            "m.gguf",
        ])
        .assert()
        .success()
        .stdout(contains("mpirun -np 8 --host h1:4,h2:4"))
        .stdout(contains("eval --model m.gguf"));
    // A lost host is given up on 5 s after ppl's own timeout; PPL_* reach every rank.
    common::ppl_cmd()
        .env("PPL_COMM_TIMEOUT", "60")
        .args(["launch", "--hosts", "h1,h2", "--dry-run", "--", "eval"])
        .assert()
        .success()
        .stdout(contains("--mca oob_tcp_keepalive_time 10"))
        .stdout(contains("--mca oob_tcp_keepalive_probes 13"))
        .stdout(contains("-x PPL_COMM_TIMEOUT"));
    common::ppl_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--mpirun",
            "/nonexistent/mpirun",
            "--",
            "eval",
        ])
        .assert()
        .failure()
        .stderr(contains("was not found on PATH"))
        .stderr(contains("openmpi-bin"));
}

#[test]
fn mpi_backend_without_the_feature_says_how_to_get_it() {
    if cfg!(feature = "mpi") {
        return;
    }
    common::ppl_cmd()
        .args([
            "eval",
            "--model",
            "m.gguf",
            "--data",
            "d.txt",
            "--backend",
            "mpi",
        ])
        .assert()
        .failure()
        .stderr(contains("--features mpi"));
}

#[test]
fn print_chunks_is_in_window_order_whatever_the_ranks() {
    let run = |ranks: &str| -> String {
        let out = common::ppl_cmd()
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args([
                "--ctx",
                "128",
                "--chunks",
                "6",
                "--precision",
                "f32",
                "--progress",
                "none",
            ])
            .args(["--print-chunks", "--schedule", "dynamic", "--ranks", ranks])
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        stdout.lines().next().unwrap_or_default().to_string()
    };
    let one = run("1");
    assert!(one.starts_with("[1]") && one.contains(",[6]"), "{one}");
    assert_eq!(run("3"), one);
}
