//! Gemma 3 270M (Q4_K_M GGUF) against llama.cpp (tests/fixtures/gemma3-llamacpp.json, measured
//! with llama-perplexity built beside the project): the same token ids from its 262k-entry
//! SentencePiece vocabulary, and the same PPL through the f32 path (llama.cpp on the f32
//! export of the same file) after 4 chunks of 512.

mod common;

use std::path::PathBuf;

use common::{gemma, ppl_cmd};
use ppl::report::Results;

fn reference() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3-llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn gemma3_token_ids_equal_llama_cpp() {
    let r = reference();
    let n = r["tokenize_excerpt_bytes"].as_u64().unwrap() as usize;
    let raw = std::fs::read(common::wikitext()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let excerpt = dir.path().join("excerpt.txt");
    std::fs::write(&excerpt, &raw[..n]).unwrap();
    let out = ppl_cmd()
        .arg("tokenize")
        .arg("--model")
        .arg(gemma())
        .arg("--file")
        .arg(&excerpt)
        .assert()
        .success();
    let ours: Vec<u64> = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let theirs: Vec<u64> = r["tokenize_excerpt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(theirs.len(), 728);
    assert_eq!(ours, theirs);
}

#[test]
fn gemma3_f32_ppl_matches_llama_cpp_after_4_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(gemma())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ctx", "512", "--chunks", "4", "--precision", "f32"])
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .assert()
        .success();
    let r: Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(r.model.architecture, "gemma3");
    assert_eq!(r.accumulator.count, 4 * 255);
    let theirs = reference()["f32_running_ppl"][3].as_f64().unwrap();
    let rel = (r.ppl - theirs).abs() / theirs;
    // Measured: 40 chunks 17.6485 vs llama.cpp's 17.6478 (4e-5); 2 chunks 14.5932 vs 14.5936.
    assert!(rel < 1e-3, "PPL {} vs llama.cpp {theirs} ({rel:e})", r.ppl);
}

#[test]
fn gemma3_native_matches_llama_cpp_within_0_2_percent() {
    // Every matrix through our kernels: Q5_0 for the 640-wide rows, the K-quants for the rest.
    let r = common::eval_model(
        &gemma(),
        &[
            "--ctx",
            "512",
            "--chunks",
            "40",
            "--ranks",
            "2",
            "--threads",
            "2",
        ],
    );
    let theirs = reference()["q4_k_m_running_ppl"][39].as_f64().unwrap();
    let rel = (r.ppl - theirs) / theirs;
    assert_eq!(r.windows.len(), 40);
    assert!(
        rel.abs() < 0.002,
        "native PPL {} vs llama.cpp {theirs} ({:+.3}%)",
        r.ppl,
        100.0 * rel
    );
}
