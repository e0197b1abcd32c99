//! `ppl validate`: a checklist with a measured value per line, exit code 0/1.

mod common;

use predicates::prelude::*;
use predicates::str::contains;

#[test]
fn a_good_configuration_passes_every_check() {
    common::ppl_cmd()
        .arg("validate")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .assert()
        .success()
        .stdout(contains("PASS  model file"))
        .stdout(contains("PASS  architecture             llama, 30 layers"))
        .stdout(contains(
            "PASS  tokenizer                gpt2 (smollm), 49152 tokens",
        ))
        .stdout(contains("PASS  memory                   need about"))
        .stdout(contains("; kernels: "))
        .stdout(contains("0 failed"));
}

#[test]
fn the_kernels_level_follows_the_cap() {
    common::ppl_cmd()
        .env("PPL_ISA", "portable")
        .arg("validate")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .assert()
        .stdout(contains("kernels: portable (advertised: "));
}

#[test]
fn failures_are_listed_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").unwrap();
    common::ppl_cmd()
        .env("PPL_MEMORY_LIMIT", "100M")
        .arg("validate")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(&latin1)
        .args(["--ctx", "9000", "--precision", "f32"])
        .assert()
        .failure()
        .code(1)
        .stdout(contains("FAIL  data"))
        .stdout(contains("not valid UTF-8"))
        .stdout(contains("FAIL  context length"))
        .stdout(contains("FAIL  memory"))
        .stdout(contains("PPL_MEMORY_LIMIT"))
        .stdout(contains("panicked").not());
}

#[test]
fn distributed_checks_on_local_ranks() {
    common::ppl_cmd()
        .arg("validate")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--distributed", "--ranks", "3"])
        .assert()
        .success()
        .stdout(contains("PASS  ranks reachable          3 ranks"))
        .stdout(contains("PASS  ping-pong 64 MiB"))
        .stdout(contains("PASS  all-reduce 64 MiB"))
        .stdout(contains(
            "PASS  fingerprints             same model, data, tokenizer and options on all 3 ranks",
        ));
}
