//! YAML configuration: the example configs, overrides, and errors that name the key.

mod common;

use predicates::prelude::*;
use predicates::str::contains;

fn config(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("configs")
        .join(name)
}

fn ppl(run_dir: &std::path::Path) -> assert_cmd::Command {
    let mut c = common::ppl_cmd();
    c.env("PPL_MODEL", common::model())
        .env("PPL_DATA", common::wikitext())
        .env("PPL_RUN_DIR", run_dir)
        .env_remove("NUM_NODES");
    c
}

#[test]
fn single_machine_config_resolves_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    ppl(dir.path())
        .args(["config", "show", "--config"])
        .arg(config("single.yaml"))
        .args(["--set", "evaluation.batch_size=2", "--ctx", "256"])
        .assert()
        .success()
        .stdout(contains("batch_size: 2"))
        .stdout(contains("max_seq_len: 256"))
        .stdout(contains("precision: f32"))
        .stdout(contains("chunks: 40"))
        .stdout(contains(format!("dir: {}", dir.path().display())));
    // A short real run from the file, overridden down to three chunks of 128 tokens.
    ppl(dir.path())
        .args(["eval", "--progress", "none", "--quiet", "--config"])
        .arg(config("single.yaml"))
        .args([
            "--set",
            "data.chunks=3",
            "--set",
            "evaluation.max_seq_len=128",
        ])
        .assert()
        .success();
    let r = ppl::report::load(&dir.path().join("results.json")).unwrap();
    assert_eq!(r.windows.len(), 3);
    assert_eq!(r.tokens, 3 * 63);
    assert_eq!(r.config["batch_size"], 4);
    assert!(
        dir.path().join("results.html").is_file(),
        "output.report: true writes the report"
    );
}

#[test]
fn two_node_config_maps_dp_onto_ranks() {
    let dir = tempfile::tempdir().unwrap();
    ppl(dir.path())
        .args(["config", "show", "--config"])
        .arg(config("dp-2node.yaml"))
        .assert()
        .success()
        .stdout(contains("dp_replicate: 2"))
        .stdout(contains("schedule: dynamic"))
        .stdout(contains("chunks: -1"));
    ppl(dir.path())
        .env("NUM_NODES", "3")
        .args(["eval", "--progress", "none", "--quiet", "--config"])
        .arg(config("dp-2node.yaml"))
        .args([
            "--set",
            "data.chunks=6",
            "--set",
            "evaluation.max_seq_len=128",
            "--precision",
            "f32",
        ])
        .assert()
        .success();
    let r = ppl::report::load(&dir.path().join("results.json")).unwrap();
    assert_eq!(r.world.size, 3);
    assert_eq!(r.ranks.len(), 3);
}

#[test]
fn pipeline_config_runs_two_stages() {
    let dir = tempfile::tempdir().unwrap();
    ppl(dir.path())
        .args(["eval", "--progress", "none", "--quiet", "--config"])
        .arg(config("pp.yaml"))
        .args([
            "--set",
            "data.chunks=2",
            "--set",
            "evaluation.max_seq_len=128",
        ])
        .assert()
        .success();
    let r = ppl::report::load(&dir.path().join("results.json")).unwrap();
    let mesh = r.mesh.expect("a pipeline run records its mesh");
    assert_eq!(mesh.dims.pp, 2);
    assert_eq!(r.world.size, 2);
}

#[test]
fn unsupported_configs_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    ppl(dir.path())
        .args(["eval", "--config"])
        .arg(config("pp.yaml"))
        .args(["--set", "parallel.cp=3", "--set", "parallel.pp=1"])
        .assert()
        .failure()
        .stderr(contains(
            "--cp 3 cuts each window into 2·cp = 6 equal chunks",
        ))
        .stderr(contains("use --ctx 510 or 516"));
    // Context parallelism cuts equal windows: stride windows are refused with the rule.
    ppl(dir.path())
        .args(["eval", "--config"])
        .arg(config("pp.yaml"))
        .args(["--set", "parallel.cp=2", "--set", "parallel.pp=1"])
        .args(["--set", "data.method=stride"])
        .assert()
        .failure()
        .stderr(contains("--cp 2 works with --method chunks only"));
    // bf16 activations exist for whole models, not for pipeline stages (yet).
    ppl(dir.path())
        .args(["eval", "--config"])
        .arg(config("pp.yaml"))
        .args(["--set", "evaluation.precision=bf16"])
        .assert()
        .failure()
        .stderr(contains("--precision bf16 with pipeline"))
        .stderr(contains("not supported yet"));
    ppl(dir.path())
        .args(["eval", "--config"])
        .arg(config("quantized.yaml"))
        .args(["--set", "evaluation.precision=fp8"])
        .assert()
        .failure()
        .stderr(contains("--set evaluation.precision=fp8"))
        .stderr(contains("must be one of native, f32, bf16, f16"));
}

#[test]
fn config_errors_name_the_key_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "model: {path: m.gguf}\nevaluation: {batch_sise: 4}\n").unwrap();
    ppl(dir.path())
        .args(["eval", "--config"])
        .arg(&bad)
        .assert()
        .failure()
        .stderr(contains(
            "unknown key 'evaluation.batch_sise'; did you mean 'evaluation.batch_size'?",
        ))
        .stderr(contains("bad.yaml"))
        .stderr(contains("panicked").not());
    std::fs::write(&bad, "evaluation: {max_seq_len: two}\n").unwrap();
    ppl(dir.path())
        .args(["config", "show", "--config"])
        .arg(&bad)
        .assert()
        .failure()
        .stderr(contains(
            "'evaluation.max_seq_len' must be an integer, got 'two'",
        ));
    std::fs::write(&bad, "model: {path: \"${PPL_NO_SUCH_VAR}\"}\n").unwrap();
    ppl(dir.path())
        .args(["config", "show", "--config"])
        .arg(&bad)
        .assert()
        .failure()
        .stderr(contains("environment variable PPL_NO_SUCH_VAR is not set"));
    ppl(dir.path())
        .args(["config", "show", "--config", "/nonexistent/c.yaml"])
        .assert()
        .failure()
        .stderr(contains("cannot read config file /nonexistent/c.yaml"));
}
