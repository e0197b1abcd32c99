//! `ppl synth`: random-weight models of a tiny custom shape load in `ppl inspect` and
//! `ppl eval` with the shape and types asked for and a finite PPL, the same seed writes the
//! same bytes, the safetensors form is the same model as the BF16 GGUF (the same PPL bits),
//! and bad flags are refused with a message naming them.

mod common;

use std::path::{Path, PathBuf};

use common::{ppl_cmd, wikitext};
use ppl::report::Results;
use predicates::str::contains;

/// A tiny custom shape whose rows (256, 512) hold K-quant blocks.
const TINY: [&str; 12] = [
    "--shape",
    "custom",
    "--hidden",
    "256",
    "--layers",
    "2",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--ffn",
    "512",
];

/// Runs `ppl synth TINY <extra> -o out` and returns `out`.
fn synth(extra: &[&str], out: &Path) -> PathBuf {
    synth_with_threads(extra, out, None)
}

/// [`synth`] with rayon's thread count pinned.
fn synth_with_threads(extra: &[&str], out: &Path, threads: Option<usize>) -> PathBuf {
    let mut cmd = ppl_cmd();
    if let Some(n) = threads {
        cmd.env("RAYON_NUM_THREADS", n.to_string());
    }
    cmd.arg("synth")
        .args(TINY)
        .arg("--tokenizer-from")
        .arg(common::model())
        .args(extra)
        .arg("-o")
        .arg(out)
        .args(["--quiet"])
        .assert()
        .success()
        .stdout(contains("its PPL means nothing"));
    out.to_path_buf()
}

fn eval(model: &Path) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(model)
        .arg("--data")
        .arg(wikitext())
        .args([
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--progress",
            "none",
            "--output",
        ])
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

fn inspect(model: &Path) -> serde_json::Value {
    let out = ppl_cmd()
        .arg("inspect")
        .arg(model)
        .arg("--json")
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

#[test]
fn tiny_models_in_three_types_load_and_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = 49152; // the SmolLM2 tokenizer's
    for (dtype, expected) in [
        ("f32", vec![("F32", 20)]),
        ("q8_0", vec![("F32", 5), ("Q8_0", 15)]),
        // Q6_K: the tied table, and attn_v/ffn_down of layer 1 (llama.cpp's use_more_bits).
        ("q4_k_m", vec![("F32", 5), ("Q4_K", 12), ("Q6_K", 3)]),
    ] {
        let path = synth(
            &["--type", dtype],
            &dir.path().join(format!("{dtype}.gguf")),
        );
        let j = inspect(&path);
        assert_eq!(j["gguf_version"], 3, "{dtype}");
        assert_eq!(j["architecture"], "llama");
        for (key, v) in [
            ("layers", 2),
            ("hidden_size", 256),
            ("heads", 4),
            ("kv_heads", 2),
            ("vocab_size", vocab),
        ] {
            assert_eq!(j[key], v, "{dtype}: {key}");
        }
        let types = j["types"].as_object().unwrap();
        assert_eq!(types.len(), expected.len(), "{dtype}: {types:?}");
        for (t, n) in expected {
            assert_eq!(types[t]["tensors"], n, "{dtype}: {t}");
        }
        let r = eval(&path);
        assert!(r.ppl.is_finite() && r.ppl > 1.0, "{dtype}: PPL {}", r.ppl);
    }
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = synth(&["--type", "q4_k_m", "--seed", "5"], &d.join("a.gguf"));
    // One thread or all: the same bytes.
    let b = synth_with_threads(
        &["--type", "q4_k_m", "--seed", "5"],
        &d.join("b.gguf"),
        Some(1),
    );
    let c = synth(&["--type", "q4_k_m", "--seed", "6"], &d.join("c.gguf"));
    let sha = |p: &Path| ppl::fingerprint::sha256_bytes(&std::fs::read(p).unwrap());
    assert_eq!(sha(&a), sha(&b));
    assert_ne!(sha(&a), sha(&c));
}

#[test]
fn the_safetensors_form_is_the_bf16_gguf_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Llama (Q/K rows in Hugging Face's rotary order), Qwen2 (biases), Gemma 3 (norms stored
    // as weight − 1).
    for family in ["llama", "qwen2", "gemma3"] {
        let gguf = synth(
            &["--family", family, "--type", "bf16"],
            &d.join(format!("{family}.gguf")),
        );
        // Gemma's directory as the README writes one, with a trailing `/`.
        let slash = if family == "gemma3" { "/" } else { "" };
        let hf = synth(
            &["--family", family, "--format", "safetensors"],
            &d.join(format!("{family}-hf{slash}")),
        );
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            assert!(hf.join(f).is_file(), "{family}: {f}");
        }
        let j = inspect(&hf);
        assert_eq!(j["hidden_size"], 256);
        let (a, b) = (eval(&gguf), eval(&hf));
        assert!(a.ppl.is_finite());
        assert_eq!(
            a.ppl.to_bits(),
            b.ppl.to_bits(),
            "{family}: {} vs {}",
            a.ppl,
            b.ppl
        );
    }
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let model = common::model();
    let fails = |args: &[&str], message: &str| {
        ppl_cmd()
            .arg("synth")
            .args(args)
            .arg("--tokenizer-from")
            .arg(&model)
            .arg("-o")
            .arg(&out)
            .assert()
            .failure()
            .stderr(contains(message));
    };
    fails(&["--shape", "gpt-9", "--type", "f32"], "llama3.2-1b");
    fails(
        &["--shape", "llama3.2-1b", "--type", "f32", "--hidden", "8"],
        "--hidden applies only to --shape custom",
    );
    fails(
        &["--shape", "custom", "--hidden", "64", "--type", "f32"],
        "--shape custom needs --layers, --heads, --ffn",
    );
    let mut tiny = TINY.to_vec();
    tiny.extend(["--type", "f32", "--vocab", "1000"]);
    fails(&tiny, "--vocab 1000");
    fails(&TINY, "--type");
    let mut st = TINY.to_vec();
    st.extend(["--format", "safetensors", "--type", "q8_0"]);
    fails(&st, "written in bf16");
    let mut odd = TINY.to_vec();
    odd[3] = "240";
    odd.extend(["--type", "q8_0"]);
    fails(&odd, "--hidden = 240 is not a multiple of 32");
    assert!(!out.exists());
}
