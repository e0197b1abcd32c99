//! What the README and `--help` promise about options, checked one by one: the quantizer
//! travels with a run (resume, `--expect`, the saved configuration), `validate` passes only
//! what `eval` runs, run state stays out of the current directory, `compare` refuses the
//! evaluation flags it cannot honour, and the summary says what happened.

mod common;

use std::path::Path;

use common::ppl_cmd;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

const SMALL: [&str; 4] = ["--ctx", "64", "--chunks", "2"];

fn eval_cmd(dir: &Path) -> assert_cmd::Command {
    let mut c = ppl_cmd();
    c.current_dir(dir)
        .arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(SMALL)
        .args(["--progress", "lines"]);
    c
}

#[test]
fn a_quantized_run_resumes_from_its_saved_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let first = dir.path().join("first.json");
    eval_cmd(dir.path())
        .args([
            "--quantize",
            "int4",
            "--group-size",
            "64",
            "--quantize-skip",
            "none",
        ])
        .arg("--run-dir")
        .arg(&run)
        .arg("-o")
        .arg(&first)
        .assert()
        .success();
    let saved = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(
        saved.contains("type: int4_weight_only")
            && saved.contains("groupsize: 64")
            && saved.contains("skip: none"),
        "{saved}"
    );
    let again = common::eval_resume(&run);
    let first = ppl::report::load(&first).unwrap();
    common::assert_same_numbers(&first, &again);
    assert_eq!(again.config["quantize"]["scheme"], "int4");
}

#[test]
fn expect_names_a_changed_quantizer() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.json");
    eval_cmd(dir.path())
        .arg("-o")
        .arg(&plain)
        .assert()
        .success();
    eval_cmd(dir.path())
        .args(["--quantize", "int4", "--expect"])
        .arg(&plain)
        .assert()
        .code(1)
        .stderr(contains("quantize: null → {").and(contains("nondeterminism").not()));
}

#[test]
fn validate_fails_what_eval_refuses() {
    let cases: &[(&[&str], &str)] = &[
        (&["--device", "cuda"], "without CUDA support"),
        (
            &["--tp-backend", "nccl", "--ranks", "3", "--tp", "3"],
            "--tp-backend nccl",
        ),
        (
            &["--precision", "bf16", "--ranks", "2", "--pp", "2"],
            "--precision bf16 with pipeline",
        ),
    ];
    for (flags, message) in cases {
        if flags.contains(&"cuda") && cfg!(feature = "cuda") {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        ppl_cmd()
            .arg("validate")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args(*flags)
            .assert()
            .code(1)
            .stdout(contains("FAIL").and(contains(*message)));
        // And eval refuses the same, before loading anything.
        eval_cmd(dir.path())
            .args(*flags)
            .assert()
            .code(1)
            .stderr(contains(*message));
    }
}

#[test]
fn run_state_goes_to_the_state_directory_and_is_listed() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = eval_cmd(cwd.path())
        .env("PPL_STATE_DIR", state.path())
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    // Nothing in the current directory; one run under the state directory, announced.
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
    let runs: Vec<_> = std::fs::read_dir(state.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1);
    assert!(
        stderr.contains(&format!("run directory {}", runs[0].display())),
        "{stderr}"
    );
    // The progress line of the last window once, and "thread" in the singular when it is one.
    assert_eq!(stderr.matches("2/2 windows").count(), 1, "{stderr}");
    ppl_cmd()
        .env("PPL_STATE_DIR", state.path())
        .arg("runs")
        .assert()
        .success()
        .stdout(contains(runs[0].display().to_string()).and(contains("complete (2 windows)")));
    // Resumed in full: no throughput is claimed for windows that were not computed.
    ppl_cmd()
        .args(["eval", "--resume"])
        .arg(&runs[0])
        .args(["--threads", "1"])
        .assert()
        .success()
        .stdout(
            contains("throughput: none measured")
                .and(contains("1 thread"))
                .and(contains("1 threads").not()),
        );
}

#[test]
fn a_benchmark_leaves_nothing_behind() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    ppl_cmd()
        .current_dir(cwd.path())
        .env("PPL_STATE_DIR", state.path())
        .arg("bench")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ctx", "64", "--chunks", "1", "--precision", "native"])
        .assert()
        .success();
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
    assert!(!state.path().join("runs").exists());
}

#[test]
fn compare_refuses_the_flags_it_cannot_honour() {
    for flag in [
        &["--report"][..],
        &["--print-chunks"],
        &["--expect", "x.json"],
    ] {
        ppl_cmd()
            .args(["compare", "--base"])
            .arg(common::model())
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args(flag)
            .assert()
            .code(1)
            .stderr(contains(format!("{} applies to `ppl eval`", flag[0])));
    }
    let help = ppl_cmd().args(["compare", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for hidden in ["--report", "--expect", "--print-chunks"] {
        assert!(!help.contains(hidden), "{hidden} in compare --help");
    }
    // A comparison keeps a ledger like an evaluation: its run directory and resume are shown.
    for shown in ["--run-dir", "--resume"] {
        assert!(help.contains(shown), "{shown} not in compare --help");
    }
}

#[test]
fn model_format_in_yaml_is_checked_against_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("c.yaml");
    std::fs::write(
        &yaml,
        format!(
            "model: {{path: {}, format: safetensors}}\ndata: {{path: {}}}\n",
            common::model().display(),
            common::wikitext().display()
        ),
    )
    .unwrap();
    ppl_cmd()
        .args(["config", "show", "--config"])
        .arg(&yaml)
        .assert()
        .code(1)
        .stderr(contains("is a file: use format: gguf"));
    std::fs::write(
        &yaml,
        format!(
            "model: {{path: {}, format: gguf}}\ndata: {{path: {}}}\noutput: {{run_dir: here}}\n",
            common::model().display(),
            common::wikitext().display()
        ),
    )
    .unwrap();
    ppl_cmd()
        .args(["config", "show", "--config"])
        .arg(&yaml)
        .assert()
        .success()
        .stdout(contains("format: gguf").and(contains(format!(
            "run_dir: {}",
            dir.path().join("here").display()
        ))));
}

#[test]
fn exporting_to_a_directory_named_with_a_trailing_slash() {
    let dir = tempfile::tempdir().unwrap();
    let out = format!("{}/model-hf/", dir.path().display());
    ppl_cmd()
        .arg("export")
        .arg(common::model())
        .args(["--dtype", "bf16", "--format", "safetensors", "-o", &out])
        .assert()
        .success();
    ppl_cmd()
        .args(["inspect", &out])
        .assert()
        .success()
        .stdout(contains("Hugging Face checkpoint"));
    // Nothing left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("model-hf")]);
}
