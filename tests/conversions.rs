//! `native` precision on other storage types against llama.cpp: the test model converted with
//! `ppl quantize` to Q8_0, Q4_K_M (Q4_K, Q6_K, Q5_0 and Q8_0 matrices) and Q4_0, evaluated by
//! ppl's own kernels and by llama.cpp's `llama-perplexity` on the same files
//! (tests/fixtures/smollm2-conversions-llamacpp.json says how the figures were made).

mod common;

use std::path::PathBuf;

use common::{eval_model, ppl_cmd};

fn fixture() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/smollm2-conversions-llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The test model converted to `scheme` (the file llama.cpp evaluated was made the same way).
fn converted(dir: &std::path::Path, scheme: &str) -> PathBuf {
    let out = dir.join(format!("smollm2-{scheme}.gguf"));
    ppl_cmd()
        .arg("quantize")
        .arg(common::model())
        .arg(&out)
        .args(["--type", scheme])
        .assert()
        .success();
    out
}

/// ppl's native PPL after `chunks` windows of 512 is within 0.2% of llama.cpp's running value
/// after as many chunks.
fn check(scheme: &str, chunks: usize) {
    let dir = tempfile::tempdir().unwrap();
    let model = converted(dir.path(), scheme);
    let chunks_arg = chunks.to_string();
    let r = eval_model(
        &model,
        &[
            "--ctx",
            "512",
            "--chunks",
            &chunks_arg,
            "--ranks",
            "2",
            "--threads",
            "2",
        ],
    );
    let want = fixture()[scheme]["running"][chunks - 1].as_f64().unwrap();
    let rel = (r.ppl - want).abs() / want;
    assert_eq!(r.windows.len(), chunks);
    assert!(
        rel < 0.002,
        "{scheme}: native PPL {} vs llama.cpp {want} ({:+.4}%)",
        r.ppl,
        100.0 * (r.ppl - want) / want
    );
}

#[test]
fn q8_0_native_matches_llama_cpp_within_0_2_percent() {
    check("q8_0", 40);
}

#[test]
fn q4_k_m_native_matches_llama_cpp_within_0_2_percent() {
    check("q4_k_m", 40);
}

#[test]
fn q4_0_native_matches_llama_cpp_within_0_2_percent() {
    check("q4_0", 40);
}
