//! F16 and BF16 models in `native` precision hold their matrices 16-bit (the file's bytes), as
//! the model reports (`Llama::weights_bytes`), the memory planner predicts (`ppl inspect`,
//! results.json `memory`), and evaluate close to their f32 evaluation; an untied 16-bit
//! embedding table stays 16-bit too.

mod common;

use std::path::{Path, PathBuf};

use ppl::model::{GgufFile, Llama, Precision};
use predicates::str::contains;

fn export(dtype: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{dtype}.gguf"));
    common::ppl_cmd()
        .args([
            "export",
            &common::model().display().to_string(),
            "--dtype",
            dtype,
            "-o",
        ])
        .arg(&out)
        .assert()
        .success()
        .stdout(contains("wrote"));
    out
}

/// Bytes the file's tensors take once held 16-bit (matrices as stored, vectors as f32).
fn file_matrix_bytes(g: &GgufFile) -> u64 {
    g.tensors
        .values()
        .map(|t| {
            let elems: u64 = t.shape.iter().map(|&d| d as u64).product();
            if t.shape.len() == 2 {
                t.size
            } else {
                elems * 4
            }
        })
        .sum()
}

#[test]
fn a_16_bit_model_is_held_16_bit_in_native_precision() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in ["f16", "bf16"] {
        let path = export(dtype, dir.path());
        let g = GgufFile::open(&path).unwrap();
        let matrices = g.tensors.values().filter(|t| t.shape.len() == 2).count();
        assert!(matrices > 200, "{dtype}: {matrices} matrices");
        let want = file_matrix_bytes(&g);
        let f32_bytes: u64 = g
            .tensors
            .values()
            .map(|t| t.shape.iter().map(|&d| d as u64).product::<u64>() * 4)
            .sum();

        // What the loaded model holds: the file's bytes (the tied table once), not twice.
        let model = Llama::from_gguf(&g, Precision::Native).unwrap();
        let held = model.weights_bytes();
        assert!(
            (held as f64 / want as f64 - 1.0).abs() < 0.01,
            "{dtype}: holds {held} bytes, the file's matrices take {want}"
        );
        assert!((held as f64) < 0.55 * f32_bytes as f64, "{dtype}: {held}");
        drop(model);

        // What `ppl inspect` and the planner report.
        let out = common::ppl_cmd()
            .arg("inspect")
            .arg(&path)
            .arg("--json")
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let i: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(i["weights_bytes"]["native"], want, "{dtype}");
        assert_eq!(i["weights_bytes"]["f32"], f32_bytes, "{dtype}");

        // An evaluation: the planner's figure in results.json, and a PPL within the 16-bit
        // rounding of the activations of the f32 evaluation of the same file.
        let r = common::eval_model(&path, &["--ctx", "128", "--chunks", "1"]);
        let memory = r.memory.as_ref().expect("memory estimate");
        assert_eq!(memory.estimate.weights_bytes, want, "{dtype}");
        let f32_eval = common::eval_model(
            &path,
            &["--ctx", "128", "--chunks", "1", "--precision", "f32"],
        );
        let rel = (r.ppl - f32_eval.ppl) / f32_eval.ppl;
        assert!(
            rel.abs() < 1e-2,
            "{dtype}: native {} vs f32 {}",
            r.ppl,
            f32_eval.ppl
        );
    }
}

#[test]
fn an_untied_16_bit_embedding_table_stays_16_bit() {
    let dir = tempfile::tempdir().unwrap();
    let tied = export("f16", dir.path());
    // The same model with an output layer of its own: a copy of the embedding table.
    let mut g = GgufFile::open(&tied).unwrap();
    let mut output = g.tensors["token_embd.weight"].clone();
    output.name = "output.weight".into();
    g.tensors.insert(output.name.clone(), output);
    let untied = dir.path().join("untied.gguf");
    ppl::model::gguf_write::write(
        &g,
        &untied,
        &ppl::model::gguf_write::Conversion::Float(candle_core::quantized::GgmlDType::F16),
    )
    .unwrap();
    let g = GgufFile::open(&untied).unwrap();
    assert!(g.tensors.contains_key("output.weight"));
    let want = file_matrix_bytes(&g);
    let model = Llama::from_gguf(&g, Precision::Native).unwrap();
    assert!(!model.config.tied_embeddings);
    let held = model.weights_bytes();
    assert!(
        (held as f64 / want as f64 - 1.0).abs() < 0.01,
        "holds {held} bytes, the file's matrices take {want}"
    );
    drop(model);
    // The table's rows are decoded exactly, so both files give the same numbers.
    let args = ["--ctx", "128", "--chunks", "1"];
    common::assert_same_numbers(
        &common::eval_model(&tied, &args),
        &common::eval_model(&untied, &args),
    );
}
