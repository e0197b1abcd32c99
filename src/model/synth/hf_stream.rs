//! The Hugging Face form of a synthetic model (`ppl synth --format safetensors`): a checkpoint
//! directory with `model.safetensors` (BF16), `config.json`, `tokenizer.json` and
//! `tokenizer_config.json`, for measuring ppl's safetensors path on the same shapes.
//!
//! The safetensors header (JSON: every tensor's dtype, shape and byte range) depends only on
//! the shapes, so it is written first and the tensors are streamed after it, a few rows at a
//! time. The values are the GGUF form's, row for row: Llama/Mistral Q/K rows are written in
//! Hugging Face's rotary order (the inverse of the permutation llama.cpp's converter applies
//! and ppl's reader undoes), and Gemma's norms are stored as 0.0 because Gemma's checkpoints
//! multiply by 1 + weight. So the BF16 GGUF and this checkpoint, from one seed, are one model.

use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use serde_json::{json, Value as Json};

use super::{tensor_plan, Family, RowStream, RowValues, Shape, Synth, SynthError, TensorSpec};
use crate::model::gguf_write::Written;
use crate::model::tokenizer_meta::CheckpointTokenizer;

/// The Hugging Face name of a GGUF tensor name of the plan.
fn hf_name(gguf: &str, family: Family) -> Option<String> {
    crate::model::hf_write::hf_name(gguf, family == Family::Gemma3)
}

/// The GGUF row whose values Hugging Face row `row` of a permuted Q/K matrix holds: within
/// each head, Hugging Face's `half * head_dim / 2 + i` is GGUF's `2 * i + half`.
fn gguf_row(row: usize, head_dim: usize) -> usize {
    let (head, within) = (row / head_dim, row % head_dim);
    let (half, i) = (within / (head_dim / 2), within % (head_dim / 2));
    head * head_dim + 2 * i + half
}

/// `config.json` for the shape.
fn config_json(shape: &Shape, tok: &CheckpointTokenizer) -> Json {
    let arch = shape.family.hf_arch();
    let (class, model_type) = (arch.hf_class(), arch.hf_model_type());
    let mut j = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tied,
        "bos_token_id": tok.bos_id,
        "eos_token_id": tok.eos_id,
        "torch_dtype": "bfloat16",
    });
    let o = j.as_object_mut().expect("a JSON object literal");
    match shape.family {
        Family::Llama => {
            o.insert("hidden_act".into(), json!("silu"));
            o.insert("attention_bias".into(), json!(false));
        }
        Family::Mistral => {
            o.insert("hidden_act".into(), json!("silu"));
            o.insert("sliding_window".into(), json!(shape.sliding_window));
        }
        Family::Qwen2 => {
            o.insert("hidden_act".into(), json!("silu"));
            o.insert("use_sliding_window".into(), json!(false));
        }
        Family::Gemma3 => {
            o.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            o.insert("sliding_window".into(), json!(shape.sliding_window));
            o.insert("sliding_window_pattern".into(), json!(6));
            o.insert("rope_local_base_freq".into(), json!(10_000.0));
            o.insert("query_pre_attn_scalar".into(), json!(shape.head_dim));
            o.insert("final_logit_softcapping".into(), Json::Null);
            o.insert("attn_logit_softcapping".into(), Json::Null);
        }
    }
    j
}

/// The safetensors header: 8-byte length, then JSON padded with spaces to 8 bytes.
fn safetensors_header(tensors: &[(String, &TensorSpec)]) -> Result<Vec<u8>, SynthError> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, spec) in tensors {
        let bytes = spec.shape.iter().product::<usize>() as u64 * 2;
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": spec.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header)
        .map_err(|e| SynthError::Unsupported(format!("safetensors header: {e}")))?;
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

/// Writes the checkpoint directory `out` (new, or an empty directory) for `synth`, whose
/// tokenizer is `tok`.
pub fn write_checkpoint(
    synth: &Synth,
    tok: &CheckpointTokenizer,
    out: &Path,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Written, SynthError> {
    let shape = &synth.shape;
    let tokenizer_json = tok.tokenizer_json.as_ref().ok_or_else(|| SynthError::Tokenizer {
        path: synth.tokenizer.path().to_path_buf(),
        detail: format!(
            "its {} tokenizer has no tokenizer.json form here, and a checkpoint needs one; take the tokenizer from a BPE model (e.g. the SmolLM2 test model of `ppl fetch-model`)",
            tok.kind
        ),
    })?;
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(SynthError::Unsupported(format!(
            "{} already exists and is not an empty directory; remove it or choose another -o",
            out.display()
        )));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io {
            path: path.clone(),
            source,
        }
    };
    let plan = tensor_plan(shape);
    let mut named: Vec<(String, &TensorSpec)> = plan
        .iter()
        .filter_map(|t| hf_name(&t.name, shape.family).map(|h| (h, t)))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let norm_value = if shape.family == Family::Gemma3 {
        0.0
    } else {
        1.0
    };

    // Beside `out`, not inside it: `components` drops the trailing `/` of `-o dir/`, which
    // would otherwise put `dir/.tmp-PID` in the directory about to be replaced.
    let beside = out.components().as_path();
    let tmp = PathBuf::from(format!("{}.tmp-{}", beside.display(), std::process::id()));
    let result = (|| -> Result<Written, SynthError> {
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let st_path = tmp.join("model.safetensors");
        let file = std::fs::File::create(&st_path).map_err(io(&st_path))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
        w.write_all(&safetensors_header(&named)?)
            .map_err(io(&st_path))?;
        for (index, (name, spec)) in named.iter().enumerate() {
            progress(index, named.len(), name);
            let values = RowValues::new(synth.seed, spec, norm_value);
            let permuted = shape.family.permutes_qk()
                && spec.shape.len() == 2
                && (spec.name.ends_with(".attn_q.weight") || spec.name.ends_with(".attn_k.weight"));
            let cols = spec.rows_cols().1;
            let head_dim = shape.head_dim;
            RowStream::new(spec, GgmlDType::BF16).run(
                |r, out| {
                    let src = if permuted { gguf_row(r, head_dim) } else { r };
                    values.push_row(src, cols, out)
                },
                |bytes| w.write_all(bytes).map_err(io(&st_path)),
            )?;
        }
        let file = w.into_inner().map_err(|e| io(&st_path)(e.into_error()))?;
        file.sync_all().map_err(io(&st_path))?;
        let json_file = |name: &str, value: &Json| -> Result<(), SynthError> {
            let path = tmp.join(name);
            let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
            std::fs::write(&path, text + "\n").map_err(io(&path))
        };
        json_file("config.json", &config_json(shape, tok))?;
        let tok_path = tmp.join("tokenizer.json");
        std::fs::write(&tok_path, tokenizer_json).map_err(io(&tok_path))?;
        json_file("tokenizer_config.json", &tok.tokenizer_config_json())?;
        if out.exists() {
            std::fs::remove_dir(out).map_err(io(out))?;
        }
        std::fs::rename(&tmp, out).map_err(io(out))?;
        let bytes = std::fs::metadata(out.join("model.safetensors")).map_or(0, |m| m.len());
        Ok(Written {
            tensors: named.len(),
            bytes,
            types: named
                .iter()
                .map(|(n, _)| (n.clone(), GgmlDType::BF16.into()))
                .collect(),
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::RopePermute;

    #[test]
    fn gguf_row_inverts_the_reader_permutation() {
        // The reader moves Hugging Face row r to GGUF row gguf_row(r).
        let hd = 8;
        let rows: Vec<u8> = (0..2 * hd as u8).collect();
        let moved = RopePermute { head_dim: hd }.apply(&rows, 1);
        for (r, &v) in rows.iter().enumerate() {
            assert_eq!(moved[gguf_row(r, hd)], v);
        }
    }

    #[test]
    fn every_planned_tensor_has_a_hugging_face_name() {
        for family in [Family::Llama, Family::Qwen2, Family::Gemma3] {
            let shape = Shape {
                family,
                qkv_bias: family == Family::Qwen2,
                tied: false,
                ..Shape::named("smollm2-135m").unwrap()
            };
            let plan = tensor_plan(&shape);
            let names: std::collections::BTreeSet<String> = plan
                .iter()
                .map(|t| hf_name(&t.name, family).unwrap_or_else(|| panic!("{}", t.name)))
                .collect();
            assert_eq!(names.len(), plan.len(), "{family:?}: names collide");
        }
        assert_eq!(
            hf_name("blk.2.ffn_norm.weight", Family::Gemma3).unwrap(),
            "model.layers.2.pre_feedforward_layernorm.weight"
        );
    }
}
