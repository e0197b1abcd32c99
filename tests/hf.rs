//! Hugging Face checkpoints: tiny random Llama, Mistral, Qwen2, Qwen3 and Gemma 3 models
//! (written by `scripts/tiny-checkpoints.py` with `transformers`, committed under
//! tests/fixtures/tiny) must give `transformers`' logits (computed there in float64) within
//! 1e-4, through our CPU kernels and through candle's ops alone (the GPU's path). SmolLM2 exported as a sharded safetensors checkpoint evaluates to the GGUF's f32
//! numbers bit for bit, alone and under tensor parallelism, with the same token ids from its
//! tokenizer.json.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_same_numbers, ppl_cmd};
use ppl::report::Results;
use predicates::str::contains;

use candle_core::{Device, Tensor};
use ppl::model::{GgufFile, Kernels, Llama, Partition, Precision};

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
    // The forward pass a GPU runs (candle's ops for attention, masks and SiLU), on the CPU.
    let part = Partition::full(model.config.n_layers);
    let gpu_path = Llama::load_with_kernels(
        &g,
        Precision::F32,
        &part,
        None,
        &Device::Cpu,
        Kernels::Candle,
    )
    .unwrap();
    let d = max_abs_diff(&gpu_path, &e);
    eprintln!("{name}: candle's ops only: max |ppl - transformers| = {d:e}");
    assert!(
        d < 1e-4,
        "{name} (candle's ops only): max |ppl - transformers| = {d:e}"
    );
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
fn gemma3_matches_transformers_with_local_and_global_layers() {
    let m = check("gemma3");
    assert!(m.config.arch.is_gemma() && m.config.qk_norm && m.config.norm_weight_plus_one);
    assert_eq!(m.config.local_layers, [true, false, true]);
    assert_eq!(m.config.sliding_window, Some(8));
    assert_eq!(m.config.rope_theta_local, 100.0);
    assert!((m.config.attention_scale.unwrap() - 1.0 / 24f64.sqrt()).abs() < 1e-7);
    // Both the window and the per-layer choice matter for this sequence.
    let g = GgufFile::open(&fixture("gemma3")).unwrap();
    let mut all_global = Llama::from_gguf(&g, Precision::Native).unwrap();
    all_global.config.sliding_window = None;
    assert!(max_abs_diff(&all_global, &expected("gemma3")) > 1e-2);
}

#[test]
fn qwen3_matches_transformers_with_qk_norms() {
    let m = check("qwen3");
    assert!(m.config.qk_norm && !m.config.attn_bias);
    assert_eq!(m.config.head_dim, 32);
    assert_ne!(m.config.head_dim * m.config.n_heads, m.config.hidden_size);
}

fn eval_model(model: &Path, extra: &[&str]) -> Results {
    let mut args = vec!["--ctx", "128", "--chunks", "3"];
    args.extend_from_slice(extra);
    common::eval_model(model, &args)
}

fn tokenize(model: &Path, file: &Path) -> String {
    let out = ppl_cmd()
        .arg("tokenize")
        .arg("--model")
        .arg(model)
        .arg("--file")
        .arg(file)
        .assert()
        .success();
    String::from_utf8(out.get_output().stdout.clone()).unwrap()
}

#[test]
fn a_safetensors_export_of_smollm2_evaluates_to_the_gguf_f32_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("smollm2-hf");
    // 515 MiB of f32 in shards of at most 200 MiB: three files and an index.
    ppl_cmd()
        .arg("export")
        .arg(common::model())
        .args([
            "--dtype",
            "f32",
            "--format",
            "safetensors",
            "--shard-size",
            "200",
            "-o",
        ])
        .arg(&dir)
        .assert()
        .success()
        .stdout(contains("272 tensors"));
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["num_key_value_heads"], 3);
    assert_eq!(config["tie_word_embeddings"], true);

    // The same ids from tokenizer.json as from the GGUF vocabulary.
    let text = tmp.path().join("excerpt.txt");
    let raw = std::fs::read_to_string(common::wikitext()).unwrap();
    std::fs::write(&text, &raw[..raw.char_indices().nth(20_000).unwrap().0]).unwrap();
    let (a, b) = (tokenize(&common::model(), &text), tokenize(&dir, &text));
    assert!(a.len() > 1000);
    assert_eq!(a, b);

    // The checkpoint's numbers = the GGUF dequantized to f32, bit for bit, both through the
    // f32 path (the own F32 kernel; `native` on an F32 checkpoint runs it too).
    let gguf = eval_model(&common::model(), &["--precision", "f32"]);
    let hf = eval_model(&dir, &["--precision", "f32"]);
    assert_same_numbers(&gguf, &hf);
    assert!(hf.model.sha256 != gguf.model.sha256);
    // Tensor parallelism reads each rank's rows of the (permuted) Q/K out of the shards.
    let tp_gguf = eval_model(
        &common::model(),
        &["--precision", "f32", "--ranks", "3", "--tp", "3"],
    );
    let tp_hf = eval_model(&dir, &["--precision", "f32", "--ranks", "3", "--tp", "3"]);
    assert_same_numbers(&tp_gguf, &tp_hf);

    // `ppl compare` takes the checkpoint as the base of a GGUF quantization (different
    // tokenizer files, the same windows of ids): the same numbers as the GGUF's f32 values.
    let compare = |base: &[&std::ffi::OsStr]| -> serde_json::Value {
        let out = tmp.path().join("c.json");
        ppl_cmd()
            .arg("compare")
            .args(base)
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args([
                "--ctx",
                "128",
                "--chunks",
                "2",
                "--progress",
                "none",
                "--quiet",
            ])
            .arg("--output")
            .arg(&out)
            .assert()
            .success();
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
    };
    let m = common::model();
    let from_hf = compare(&["--base".as_ref(), dir.as_os_str()]);
    let from_gguf = compare(&[
        "--base".as_ref(),
        m.as_os_str(),
        "--base-precision".as_ref(),
        "f32".as_ref(),
    ]);
    for key in ["ppl_base", "ppl_model", "kld_mean", "same_top"] {
        assert_eq!(from_hf[key], from_gguf[key], "{key}");
    }
    assert!(from_hf["kld_mean"].as_f64().unwrap() > 0.0);

    // Exporting into a directory that holds files is refused, and leaves it alone.
    ppl_cmd()
        .arg("export")
        .arg(common::model())
        .args(["--dtype", "bf16", "--format", "safetensors", "-o"])
        .arg(&dir)
        .assert()
        .failure()
        .stderr(contains("already exists"));
    assert!(dir.join("model-00002-of-00003.safetensors").is_file());
}

fn copy_fixture(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

#[test]
fn broken_checkpoints_are_named_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let inspect = |dir: &Path| {
        ppl_cmd()
            .arg("inspect")
            .arg(dir)
            .assert()
            .failure()
            .get_output()
            .stderr
            .clone()
    };
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(text(inspect(&empty)).contains("no config.json"));

    let other = tmp.path().join("gpt2");
    copy_fixture("llama", &other);
    let cfg = std::fs::read_to_string(other.join("config.json")).unwrap();
    std::fs::write(
        other.join("config.json"),
        cfg.replace("\"llama\"", "\"gpt2\""),
    )
    .unwrap();
    let e = text(inspect(&other));
    assert!(
        e.contains("model_type 'gpt2' is not supported") && e.contains("qwen3"),
        "{e}"
    );

    let cut = tmp.path().join("cut");
    copy_fixture("qwen2", &cut);
    let st = std::fs::read(cut.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &st[..st.len() / 2]).unwrap();
    let e = text(inspect(&cut));
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );

    // A checkpoint without tokenizer.json cannot be evaluated on text: say so.
    let no_tok = tmp.path().join("no-tok");
    copy_fixture("qwen3", &no_tok);
    let data = tmp.path().join("d.txt");
    std::fs::write(&data, "some text to score").unwrap();
    ppl_cmd()
        .args(["eval", "--ctx", "8", "--model"])
        .arg(&no_tok)
        .arg("--data")
        .arg(&data)
        .assert()
        .failure()
        .stderr(contains("no tokenizer.json"));
}

/// A block tensor the file lacks is an error naming the checkpoint and the tensor, whether
/// the rank holds the whole block or a tensor-parallel or FSDP part of it (no panic).
#[test]
fn a_missing_block_tensor_is_named_with_its_checkpoint() {
    let dir = fixture("gemma3");
    for missing in [
        "blk.1.attn_k.weight",
        "blk.1.attn_k_norm.weight",
        "blk.0.post_ffw_norm.weight",
    ] {
        let mut g = GgufFile::open(&dir).unwrap();
        assert!(g.tensors.remove(missing).is_some(), "{missing}");
        let n = ppl::model::LlamaConfig::from_gguf(&g).unwrap().n_layers;
        let whole = Partition::full(n);
        let parts = [
            whole.clone(),
            Partition {
                fsdp_rank: 1,
                fsdp: 2,
                ..whole.clone()
            },
        ];
        for part in parts {
            let e = match Llama::from_gguf_part(&g, Precision::F32, &part) {
                Ok(_) => panic!("{missing} removed, {part:?}: the model loaded"),
                Err(e) => e.to_string(),
            };
            assert!(
                e.contains(&dir.display().to_string())
                    && e.contains(&format!("tensor '{missing}' is missing")),
                "{missing}, {part:?}: {e}"
            );
        }
    }
}

/// Llama 3.x's `llama3` rotary scaling (frequency-dependent divisors, an original context of
/// 8 in a 24-token sequence) and `linear` scaling, as config.json states them.
#[test]
fn llama3_and_linear_rope_scaling_match_transformers() {
    check("llama-rope-llama3");
    check("llama-rope-linear");
}
