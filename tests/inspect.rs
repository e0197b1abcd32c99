//! `ppl inspect` and `ppl models`: what the header of a GGUF holds, without loading weights.

mod common;

use common::ppl_cmd;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

fn inspect_json(path: &std::path::Path) -> serde_json::Value {
    let out = ppl_cmd()
        .arg("inspect")
        .arg(path)
        .arg("--json")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn smollm2_header_in_numbers() {
    let i = inspect_json(&common::model());
    assert_eq!(i["architecture"], "llama");
    assert_eq!(i["supported"], true);
    assert_eq!(i["parameters"], 134_515_008u64);
    assert_eq!(i["tensors"], 272);
    assert_eq!(i["types"]["Q4_1"]["tensors"], 210);
    assert_eq!(i["types"]["Q8_0"]["tensors"], 1);
    assert_eq!(i["types"]["F32"]["tensors"], 61);
    assert_eq!(i["layers"], 30);
    assert_eq!(i["hidden_size"], 576);
    assert_eq!(i["heads"], 9);
    assert_eq!(i["kv_heads"], 3);
    assert_eq!(i["context_length"], 8192);
    assert_eq!(i["vocab_size"], 49152);
    assert_eq!(i["tokenizer"], "gpt2");
    // f32: every parameter in 4 bytes (the tied table once); bf16 and f16 half of it.
    let w = &i["weights_bytes"];
    assert_eq!(w["f32"], 134_515_008u64 * 4);
    assert_eq!(w["bf16"], 134_515_008u64 * 2);
    ppl_cmd()
        .arg("inspect")
        .arg(common::model())
        .assert()
        .success()
        .stdout(contains("134.5 M"))
        .stdout(contains("Q4_1    210 tensors"));
}

#[test]
fn gemma3_and_bad_files() {
    let gemma = common::gemma();
    let i = inspect_json(&gemma);
    assert_eq!(i["architecture"], "gemma3");
    assert_eq!(i["supported"], true);
    assert_eq!(i["layers"], 18);
    assert_eq!(i["parameters"], 268_098_176u64);
    assert_eq!(i["vocab_size"], 262_144);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("notes.gguf");
    std::fs::write(&bad, "not a model").unwrap();
    ppl_cmd()
        .arg("inspect")
        .arg(&bad)
        .assert()
        .failure()
        .stderr(contains("notes.gguf"))
        .stderr(contains("panicked").not());
    // `ppl models` lists the cache (the tests' own copy).
    ppl_cmd()
        .arg("models")
        .assert()
        .success()
        .stdout(contains("SmolLM2-135M-Instruct.Q4_1.gguf"))
        .stdout(contains("134.5 M params"));
}
