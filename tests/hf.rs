//! Hugging Face checkpoints: tiny random Llama, Mistral, Qwen2 and Qwen3 models (written by
//! `scripts/tiny-checkpoints.py` with `transformers`, committed under tests/fixtures/tiny)
//! must give `transformers`' logits (computed there in float64) within 1e-4.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use ppl::model::{GgufFile, Llama, Precision};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

struct Expected {
    ids: Vec<u32>,
    logits: Vec<Vec<f64>>,
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    Expected {
        ids: j["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect(),
        logits: j["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect()
            })
            .collect(),
    }
}

/// Largest |ours - transformers| over every position and vocabulary entry.
fn max_abs_diff(model: &Llama, e: &Expected) -> f64 {
    let ids = Tensor::new(e.ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let ours = model
        .forward(&ids)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(ours.len(), e.logits.len());
    let mut worst = 0f64;
    for (a, b) in ours.iter().zip(&e.logits) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((*x as f64 - y).abs());
        }
    }
    worst
}

fn check(name: &str) -> Llama {
    let g = GgufFile::open(&fixture(name)).unwrap();
    let model = Llama::from_gguf(&g, Precision::Native).unwrap();
    let e = expected(name);
    // The logits span several units: a wrong rotation, mask or bias shows as O(1) errors.
    let spread = e.logits[0].iter().cloned().fold(f64::MIN, f64::max)
        - e.logits[0].iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        spread > 2.0,
        "{name}: logits too flat to test anything ({spread})"
    );
    let d = max_abs_diff(&model, &e);
    eprintln!("{name}: max |ppl - transformers| = {d:e} (logit spread {spread:.2})");
    assert!(d < 1e-4, "{name}: max |ppl - transformers| = {d:e}");
    model
}

#[test]
fn llama_matches_transformers() {
    let m = check("llama");
    assert!(m.config.tied_embeddings && !m.config.rope_neox);
}

#[test]
fn mistral_matches_transformers_with_its_sliding_window() {
    let m = check("mistral");
    assert_eq!(m.config.sliding_window, Some(8));
    assert!(!m.config.tied_embeddings);
    // The window matters for this sequence (24 positions > 8): without it the logits differ.
    let g = GgufFile::open(&fixture("mistral")).unwrap();
    let mut full = Llama::from_gguf(&g, Precision::Native).unwrap();
    full.config.sliding_window = None;
    assert!(max_abs_diff(&full, &expected("mistral")) > 1e-2);
}

#[test]
fn qwen2_matches_transformers_with_qkv_biases() {
    let m = check("qwen2");
    assert!(m.config.attn_bias && m.config.rope_neox && !m.config.qk_norm);
}

#[test]
fn qwen3_matches_transformers_with_qk_norms() {
    let m = check("qwen3");
    assert!(m.config.qk_norm && !m.config.attn_bias);
    assert_eq!(m.config.head_dim, 32);
    assert_ne!(m.config.head_dim * m.config.n_heads, m.config.hidden_size);
}
