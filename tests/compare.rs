//! `ppl compare`: a model against itself is KLD 0 and 100% same top token; a quantized model
//! has KLD > 0 (never negative), its PPL equals what `ppl eval` reports for it, and models
//! with different tokenizers are refused.

mod common;

use common::{eval, ppl_cmd};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

fn compare(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.json");
    ppl_cmd()
        .arg("compare")
        .arg("--base")
        .arg(common::model())
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
            "--quiet",
        ])
        .args(extra)
        .arg("--output")
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

#[test]
fn a_model_against_itself_is_identical() {
    let c = compare(&[]);
    assert_eq!(c["kld_mean"], 0.0);
    assert_eq!(c["kld_percentiles"]["max"], 0.0);
    assert_eq!(c["same_top"], 100.0);
    assert_eq!(c["delta_ppl"], 0.0);
    assert_eq!(c["ppl_base"], c["ppl_model"]);
    assert_eq!(c["tokens"], 4 * 63);
    assert_eq!(c["windows"].as_array().unwrap().len(), 4);
}

#[test]
fn a_quantized_model_against_its_base() {
    let c = compare(&["--quantize", "int4", "--group-size", "64"]);
    let f = |k: &str| c[k].as_f64().unwrap();
    assert!(f("kld_mean") > 0.0 && f("kld_mean_err") > 0.0);
    assert!(c["kld_percentiles"]["min"].as_f64().unwrap() >= 0.0);
    assert!(f("same_top") < 100.0 && f("same_top") > 50.0);
    // Each side's PPL is what `ppl eval` reports for it (float sums vs fixed point: 1e-9).
    let base = eval(&["--ctx", "128", "--chunks", "4", "--precision", "f32"]);
    let quant = eval(&[
        "--ctx",
        "128",
        "--chunks",
        "4",
        "--precision",
        "f32",
        "--quantize",
        "int4",
        "--group-size",
        "64",
    ]);
    assert!(((f("ppl_base") - base.ppl) / base.ppl).abs() < 1e-9);
    assert!(((f("ppl_model") - quant.ppl) / quant.ppl).abs() < 1e-9);
    assert!((f("delta_ppl") - (quant.ppl - base.ppl)).abs() < 1e-6);
    assert!(f("delta_ppl_err") > 0.0);
    let ratio = c["ppl_ratio"]["value"].as_f64().unwrap();
    assert!((ratio - quant.ppl / base.ppl).abs() < 1e-9);
    assert!(f("cor_ln_ppl") > 0.9 && f("cor_ln_ppl") <= 1.0);
}

#[test]
fn models_with_different_tokenizers_are_refused() {
    let gemma = ppl::model::fetch::cache_dir()
        .join("models")
        .join("gemma-3-270m-q4_k_m.gguf");
    if !gemma.is_file() {
        panic!("run `ppl fetch-model gemma3` first (CI does)");
    }
    ppl_cmd()
        .arg("compare")
        .arg("--base")
        .arg(&gemma)
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--chunks", "1"])
        .assert()
        .failure()
        .stderr(contains("different tokenizers"))
        .stderr(contains("panicked").not());
}

#[test]
fn a_missing_base_is_named_as_such() {
    ppl_cmd()
        .args(["compare", "--base", "/nonexistent/base.gguf", "--model"])
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .assert()
        .failure()
        .stderr(contains("/nonexistent/base.gguf (--base)"))
        .stderr(contains("panicked").not());
}
