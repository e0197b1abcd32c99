//! `ppl export` and `ppl quantize`: written GGUF files evaluate to exactly what the in-memory
//! conversions give (`--precision f32|bf16`, `--quantize` at load), bit for bit; bf16 and f16
//! activations stay within their rounding of f32; types GGUF cannot hold and unreadable inputs
//! are refused cleanly.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_same_numbers, eval, ppl_cmd};
use ppl::model::GgufFile;
use ppl::report::Results;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

const WORKLOAD: [&str; 4] = ["--ctx", "128", "--chunks", "2"];

fn eval_file(model: &Path, extra: &[&str]) -> Results {
    let mut args = WORKLOAD.to_vec();
    args.extend_from_slice(extra);
    common::eval_model(model, &args)
}

fn run(args: &[&str], output: &Path) -> PathBuf {
    ppl_cmd()
        .args(args)
        .arg(output)
        .assert()
        .success()
        .stdout(contains("wrote"));
    output.to_path_buf()
}

fn types(path: &Path) -> Vec<String> {
    let g = GgufFile::open(path).unwrap();
    g.tensors
        .values()
        .map(|t| format!("{:?}", t.dtype))
        .collect()
}

#[test]
fn an_f32_export_is_the_f32_evaluation_of_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let m = common::model().display().to_string();
    let f32 = run(
        &["export", &m, "--dtype", "f32", "-o"],
        &dir.path().join("f32.gguf"),
    );
    let t = types(&f32);
    assert_eq!(t.len(), 272);
    assert!(t.iter().all(|t| t == "F32"), "{t:?}");
    // The file's weights in their native path (the own F32 kernel, in place from the map) =
    // the original dequantized at load (`--precision f32`: the same F32 kernel on candle's
    // dequantized values), bit for bit: PPL, ±, the exact totals and every window. And the
    // native path is exact in itself: the same bits at another batch size.
    let mut args = WORKLOAD.to_vec();
    args.extend(["--precision", "f32"]);
    let (dequantized, native) = (eval(&args), eval_file(&f32, &[]));
    assert_same_numbers(&dequantized, &native);
    assert_same_numbers(&native, &eval_file(&f32, &["--batch-size", "3"]));
    // Metadata travels: the same tokenizer, and the file type says F32.
    let (a, b) = (
        GgufFile::open(&common::model()).unwrap(),
        GgufFile::open(&f32).unwrap(),
    );
    assert_eq!(
        a.metadata.get("tokenizer.ggml.tokens"),
        b.metadata.get("tokenizer.ggml.tokens")
    );
    assert_eq!(b.get("general.file_type").and_then(|v| v.as_u64()), Some(0));

    // bf16: half the bytes, the PPL within bf16 rounding of the weights.
    let bf16 = run(
        &["export", &m, "--dtype", "bf16", "-o"],
        &dir.path().join("bf16.gguf"),
    );
    let t = types(&bf16);
    assert_eq!(t.iter().filter(|t| *t == "BF16").count(), 211);
    let size = |p: &Path| std::fs::metadata(p).unwrap().len() as f64;
    assert!((size(&bf16) / size(&f32) - 0.5).abs() < 0.01);
    let (full, half) = (eval_file(&f32, &[]), eval_file(&bf16, &[]));
    let rel = (half.ppl - full.ppl) / full.ppl;
    assert!(
        rel.abs() < 5e-3 && rel != 0.0,
        "bf16 {} vs f32 {}",
        half.ppl,
        full.ppl
    );
}

#[test]
fn a_quantized_file_is_the_quantization_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let m = common::model().display().to_string();
    // llama.cpp's q4_k_m mix: Q6_K for ffn_down in the 14 layers use_more_bits picks, Q4_K
    // for the other 16; rows of 576 fall back (Q4_K → Q5_0, Q6_K → Q8_0: attn_v of those 14
    // layers and the tied output/embedding table).
    let q4k = run(
        &[
            "quantize",
            &m,
            "--type",
            "q4_k_m",
            "--quantize-skip",
            "none",
        ],
        &dir.path().join("q4k.gguf"),
    );
    let t = types(&q4k);
    let count = |ty: &str| t.iter().filter(|t| *t == ty).count();
    assert_eq!(
        [
            count("Q4K"),
            count("Q6K"),
            count("Q5_0"),
            count("Q8_0"),
            count("F32")
        ],
        [16, 14, 166, 15, 61],
        "{t:?}"
    );
    let g = GgufFile::open(&q4k).unwrap();
    assert_eq!(
        g.get("general.file_type").and_then(|v| v.as_u64()),
        Some(15)
    );
    let mut at_load = WORKLOAD.to_vec();
    at_load.extend(["--quantize", "q4_k_m", "--quantize-skip", "none"]);
    assert_same_numbers(&eval(&at_load), &eval_file(&q4k, &[]));

    // q8_0 with the embedding table left as stored (tied: it follows the output layer).
    let q8 = run(
        &[
            "quantize",
            &m,
            "--type",
            "q8_0",
            "--quantize-skip",
            "embeddings,output",
        ],
        &dir.path().join("q8.gguf"),
    );
    let mut at_load = WORKLOAD.to_vec();
    at_load.extend(["--quantize", "q8_0", "--quantize-skip", "embeddings,output"]);
    assert_same_numbers(&eval(&at_load), &eval_file(&q8, &[]));
    let g = GgufFile::open(&q8).unwrap();
    assert_eq!(g.get("general.file_type").and_then(|v| v.as_u64()), Some(7));
    assert_eq!(
        g.get("general.quantization_version")
            .and_then(|v| v.as_u64()),
        Some(2)
    );
}

#[test]
fn types_gguf_cannot_hold_and_bad_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let m = common::model().display().to_string();
    ppl_cmd()
        .args(["quantize", &m])
        .arg(&out)
        .args(["--type", "int4"])
        .assert()
        .failure()
        .stderr(contains("int4 has no GGUF type"))
        .stderr(contains("--quantize int4"))
        .stderr(contains("panicked").not());
    assert!(!out.exists());
    let text = dir.path().join("not.gguf");
    std::fs::write(&text, "plain text, not a model").unwrap();
    ppl_cmd()
        .arg("export")
        .arg(&text)
        .args(["--dtype", "f16", "-o"])
        .arg(&out)
        .assert()
        .failure()
        .stderr(contains("not.gguf"))
        .stderr(contains("panicked").not());
    ppl_cmd()
        .args([
            "export",
            &m,
            "--dtype",
            "f16",
            "-o",
            "/nonexistent/dir/x.gguf",
        ])
        .assert()
        .failure()
        .stderr(contains("/nonexistent/dir/x.gguf"))
        .stderr(contains("panicked").not());
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() == 1,
        "no partial output"
    );
}

/// The README's promise with the defaults of both commands: `ppl quantize --type q4_0` writes
/// what `eval --quantize q4_0` scores (the tied table follows the output layer in both), in a
/// file labelled GGUF version 3 like its input.
#[test]
fn a_quantized_file_with_default_options_scores_as_quantize_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let m = common::model().display().to_string();
    let q4 = run(
        &["quantize", &m, "--type", "q4_0"],
        &dir.path().join("q4_0.gguf"),
    );
    let mut at_load = WORKLOAD.to_vec();
    at_load.extend(["--quantize", "q4_0"]);
    assert_same_numbers(&eval(&at_load), &eval_file(&q4, &[]));
    let head = std::fs::read(&q4).unwrap();
    assert_eq!(&head[..4], b"GGUF");
    assert_eq!(u32::from_le_bytes(head[4..8].try_into().unwrap()), 3);
    assert_eq!(GgufFile::open(&q4).unwrap().version, 3);
}
