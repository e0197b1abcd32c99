//! Slurm: `ppl launch --launcher srun` and a plain 2-task `srun`, for real, on the one-node
//! Slurm that `scripts/slurm-local.sh up` starts (CI starts it). Where no Slurm controller
//! answers, the tests say so and pass without running.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_same_numbers, model, wikitext};
use ppl::report::Results;

/// Why Slurm cannot be used here, if it cannot.
fn unavailable() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some("ppl was built without the mpi feature".into());
    }
    // `sinfo` answers within a second when a controller runs; bound it anyway.
    let out = Command::new("timeout")
        .args(["10", "sinfo", "-h", "-o", "%t"])
        .output();
    match out {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("idle") => None,
        Ok(o) => Some(format!(
            "a Slurm controller with an idle node (sinfo: {}{}); start one with scripts/slurm-local.sh up",
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("Slurm's sinfo ({e}); start one with scripts/slurm-local.sh up")),
    }
}

const ARGS: [&str; 4] = ["--ctx", "128", "--chunks", "4"];

fn eval_under(launcher: &[&str]) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let o = Command::new("timeout")
        .arg(Duration::from_secs(300).as_secs().to_string())
        .args(launcher)
        .arg("eval")
        .arg("--model")
        .arg(model())
        .arg("--data")
        .arg(wikitext())
        .args(ARGS)
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{launcher:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

#[test]
fn srun_and_ppl_launch_with_srun_give_the_numbers_of_one_process() {
    if let Some(why) = unavailable() {
        // CI starts a local Slurm and sets PPL_REQUIRE_SLURM: there a skip would hide a failure.
        assert!(
            std::env::var_os("PPL_REQUIRE_SLURM").is_none(),
            "PPL_REQUIRE_SLURM is set but the Slurm tests need {why}"
        );
        eprintln!("SKIPPED: the Slurm tests need {why}");
        return;
    }
    let one = common::eval(&ARGS);
    let ppl = env!("CARGO_BIN_EXE_ppl");
    let launched = eval_under(&[
        ppl,
        "launch",
        "--launcher",
        "srun",
        "--nproc-per-node",
        "2",
        "--",
    ]);
    assert_same_numbers(&one, &launched);
    assert_eq!(
        (launched.world.backend.as_str(), launched.world.size),
        ("mpi", 2)
    );
    let plain = eval_under(&["srun", "-n", "2", ppl]);
    assert_same_numbers(&one, &plain);
    assert_eq!(plain.ranks.len(), 2);
}

#[test]
fn launch_builds_the_srun_command() {
    common::ppl_cmd()
        .args([
            "launch",
            "--launcher",
            "srun",
            "--nproc-per-node",
            "4",
            "--hosts",
            "n1,n2",
            "--dry-run",
            "--",
            "eval",
            "--model",
            "m.gguf",
        ])
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "srun --ntasks-per-node=4 --kill-on-bad-exit=1 --nodes=2 --nodelist=n1,n2",
        ))
        .stdout(predicates::str::contains("eval --model m.gguf"));
    common::ppl_cmd()
        .args([
            "launch",
            "--launcher",
            "srun",
            "--hostfile",
            "h.txt",
            "--",
            "eval",
        ])
        .assert()
        .failure()
        .stderr(predicates::str::contains("--hostfile is for mpirun"));
}
