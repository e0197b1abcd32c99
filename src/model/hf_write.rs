//! Writing a Hugging Face checkpoint (`ppl export --format safetensors`): `config.json`,
//! `model.safetensors` (or shards and `model.safetensors.index.json`), `tokenizer.json` and
//! `tokenizer_config.json`, from any model ppl loads.
//!
//! Matrices are dequantized and stored in the float type asked for; Llama/Mistral Q/K rows are
//! put back into Hugging Face's rotary layout (the inverse of [`super::gguf::RopePermute`]),
//! so `transformers` reads the directory as the same model, and ppl reading it back gets the
//! GGUF's numbers exactly. Everything is written into a temporary directory that is renamed
//! into place at the end: a failure leaves no partial checkpoint.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use serde_json::{json, Value as Json};

use super::arch::Arch;
use super::gguf::GgufFile;
use super::gguf_write::{WriteError, Written};
use super::tokenizer_meta::{CheckpointTokenizer, ExportTokenizer};
use super::LlamaConfig;

/// The Hugging Face name of a GGUF tensor name (the inverse of the reader's mapping);
/// `gemma`: Gemma 3's four norms per layer (`ppl synth` writes Gemma checkpoints).
pub(crate) fn hf_name(gguf: &str, gemma: bool) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let (layer, rest) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let (short, kind) = rest.rsplit_once('.')?;
    let module = match short {
        "attn_norm" => "input_layernorm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{kind}"))
}

/// Inverse of the converter's Q/K permutation: GGUF row `2 * i + half` of each head goes
/// back to `half * head_dim / 2 + i`.
fn unpermute(bytes: &[u8], row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let rows = bytes.len() / row_bytes;
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        let (head, within) = (r / head_dim, r % head_dim);
        let (i, half) = (within / 2, within % 2);
        let dst = head * head_dim + half * head_dim / 2 + i;
        out[dst * row_bytes..(dst + 1) * row_bytes]
            .copy_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

fn dtype_names(dtype: GgmlDType) -> Result<(&'static str, &'static str), WriteError> {
    Ok(match dtype {
        GgmlDType::F32 => ("F32", "float32"),
        GgmlDType::F16 => ("F16", "float16"),
        GgmlDType::BF16 => ("BF16", "bfloat16"),
        d => {
            return Err(WriteError::Unsupported(format!(
                "--dtype {d:?}: a safetensors checkpoint is written in f32, f16 or bf16"
            )))
        }
    })
}

/// `config.json` for the model.
fn config_json(c: &LlamaConfig, tok: &CheckpointTokenizer, torch_dtype: &str) -> Json {
    let mut j = json!({
        "architectures": [c.arch.hf_class()],
        "model_type": c.arch.hf_model_type(),
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.context_length,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": c.tied_embeddings,
        "bos_token_id": tok.bos_id,
        "eos_token_id": tok.eos_id,
        "torch_dtype": torch_dtype,
    });
    let o = j.as_object_mut().expect("an object");
    match c.arch {
        Arch::Llama => {
            o.insert("attention_bias".into(), json!(c.attn_output_bias));
        }
        Arch::Mistral => {
            o.insert("sliding_window".into(), json!(c.sliding_window));
        }
        Arch::Qwen2 => {
            o.insert("use_sliding_window".into(), json!(false));
        }
        // Gemma 3 is refused before this (`write_checkpoint`).
        Arch::Qwen3 | Arch::Gemma3 => {
            o.insert("attention_bias".into(), json!(c.attn_bias));
        }
    }
    j
}

/// A tensor to write: name, shape, little-endian bytes.
type Entry = (String, Vec<usize>, Vec<u8>);

/// A safetensors file: header (8-byte length, JSON padded to 8 bytes), then the data.
fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    dtype: &str,
) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes.len()]}),
        );
        offset += bytes.len();
    }
    let mut text = serde_json::to_string(&header)?.into_bytes();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&(text.len() as u64).to_le_bytes())?;
    f.write_all(&text)?;
    for (_, _, bytes) in tensors {
        f.write_all(bytes)?;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// Writes the checkpoint directory `out` (which must not exist, or be empty).
pub fn write(
    src: &GgufFile,
    tok: &dyn ExportTokenizer,
    out: &Path,
    dtype: GgmlDType,
    shard_bytes: u64,
) -> Result<Written, WriteError> {
    let tok = &tok
        .checkpoint_tokenizer()
        .map_err(WriteError::Unsupported)?;
    let (st_dtype, torch_dtype) = dtype_names(dtype)?;
    // `model-hf/` names the same directory as `model-hf`: without the trailing separator, so
    // the temporary directory beside it is not made inside it.
    let out: &Path = &out.components().collect::<PathBuf>();
    let config = LlamaConfig::from_gguf(src).map_err(|e| WriteError::Unsupported(e.to_string()))?;
    if config.arch.is_gemma() {
        return Err(WriteError::Unsupported(format!(
            "{}: writing Gemma 3 as a Hugging Face checkpoint is not supported (its norms and layer types need Gemma's own config); evaluate the GGUF directly",
            src.path().display()
        )));
    }
    let scaled_key = format!(
        "{}.{}",
        config.arch.gguf_name(),
        crate::model::rope_scaling::FREQ_FACTORS_KEY
    );
    if src.tensors.contains_key("rope_freqs.weight") || src.get(&scaled_key).is_some() {
        return Err(WriteError::Unsupported(format!(
            "{}: the model scales its rotary frequencies (rope_freqs), which ppl cannot express in config.json",
            src.path().display()
        )));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io {
            path: path.clone(),
            source,
        }
    };
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(WriteError::Unsupported(format!(
            "{} already exists and is not an empty directory; remove it or choose another --output",
            out.display()
        )));
    }
    let permute = config.arch.hf_permutes_qk();
    let tensor_err = |name: &str| {
        let (path, name) = (src.path().to_path_buf(), name.to_string());
        move |source| WriteError::Tensor {
            path: path.clone(),
            name: name.clone(),
            source: Box::new(source),
        }
    };

    let tmp = PathBuf::from(format!("{}.tmp-{}", out.display(), std::process::id()));
    let result = (|| -> Result<Written, WriteError> {
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        // Tensors in Hugging Face name order, cut into shards of at most `shard_bytes`.
        let mut names: Vec<(String, String)> = src
            .tensors
            .keys()
            .filter_map(|g| hf_name(g, false).map(|h| (h, g.clone())))
            .collect();
        names.sort();
        let mut current: Vec<Entry> = Vec::new();
        let mut shard_size = 0u64;
        let mut types = Vec::new();
        let mut total = 0u64;
        let mut pending_files = Vec::new();
        let mut flush =
            |shard: Vec<(String, Vec<usize>, Vec<u8>)>, index: usize| -> Result<(), WriteError> {
                let path = tmp.join(format!("shard-{index}"));
                write_safetensors(&path, &shard, st_dtype).map_err(io(&path))?;
                pending_files.push((
                    path,
                    shard.into_iter().map(|(n, _, _)| n).collect::<Vec<_>>(),
                ));
                Ok(())
            };
        let mut written_shards = 0;
        for (hf, gguf) in &names {
            let info = &src.tensors[gguf];
            let f32s = src
                .qtensor(gguf, &info.shape, &Device::Cpu)?
                .dequantize(&Device::Cpu)
                .map_err(tensor_err(gguf))?;
            let target = match dtype {
                GgmlDType::F32 => candle_core::DType::F32,
                GgmlDType::F16 => candle_core::DType::F16,
                _ => candle_core::DType::BF16,
            };
            let t = f32s.to_dtype(target).map_err(tensor_err(gguf))?;
            let flat = t.flatten_all().map_err(tensor_err(gguf))?;
            let mut bytes: Vec<u8> = match dtype {
                GgmlDType::F32 => flat
                    .to_vec1::<f32>()
                    .map_err(tensor_err(gguf))?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
                GgmlDType::F16 => flat
                    .to_vec1::<half::f16>()
                    .map_err(tensor_err(gguf))?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
                _ => flat
                    .to_vec1::<half::bf16>()
                    .map_err(tensor_err(gguf))?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            };
            let is_qk = [
                ".attn_q.weight",
                ".attn_k.weight",
                ".attn_q.bias",
                ".attn_k.bias",
            ]
            .iter()
            .any(|s| gguf.ends_with(s));
            if permute && is_qk {
                let rows = info.shape[0];
                bytes = unpermute(&bytes, bytes.len() / rows, config.head_dim);
            }
            let len = bytes.len() as u64;
            if shard_size > 0 && shard_size + len > shard_bytes {
                flush(std::mem::take(&mut current), written_shards)?;
                written_shards += 1;
                shard_size = 0;
            }
            shard_size += len;
            total += len;
            types.push((hf.clone(), dtype));
            current.push((hf.clone(), info.shape.clone(), bytes));
        }
        flush(current, written_shards)?;
        let n = pending_files.len();
        let mut weight_map = BTreeMap::new();
        for (i, (path, tensors)) in pending_files.iter().enumerate() {
            let name = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            };
            let dest = tmp.join(&name);
            std::fs::rename(path, &dest).map_err(io(&dest))?;
            for t in tensors {
                weight_map.insert(t.clone(), name.clone());
            }
        }
        let json_file = |name: &str, value: &Json| -> Result<(), WriteError> {
            let path = tmp.join(name);
            let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
            std::fs::write(&path, text + "\n").map_err(io(&path))
        };
        if n > 1 {
            json_file(
                "model.safetensors.index.json",
                &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
            )?;
        }
        json_file("config.json", &config_json(&config, tok, torch_dtype))?;
        match &tok.tokenizer_json {
            Some(text) => {
                let path = tmp.join("tokenizer.json");
                std::fs::write(&path, text).map_err(io(&path))?;
                json_file("tokenizer_config.json", &tok.tokenizer_config_json())?;
            }
            None => tracing::warn!(
                "the {} tokenizer has no tokenizer.json form here: the checkpoint has no tokenizer",
                tok.kind
            ),
        }
        if out.exists() {
            std::fs::remove_dir(out).map_err(io(out))?;
        }
        std::fs::rename(&tmp, out).map_err(io(out))?;
        let bytes = super::hf::checkpoint_files(out)
            .map_err(io(out))?
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        Ok(Written {
            tensors: types.len(),
            bytes,
            types: types.into_iter().map(|(n, t)| (n, t.into())).collect(),
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
    fn unpermute_inverts_the_reader_permutation() {
        let bytes: Vec<u8> = (0..48).collect();
        for hd in [2, 4, 8] {
            let there = RopePermute { head_dim: hd }.apply(&bytes, 2);
            assert_eq!(unpermute(&there, 2, hd), bytes);
        }
    }

    #[test]
    fn names_round_trip() {
        for (g, h) in [
            ("blk.7.attn_q.bias", "model.layers.7.self_attn.q_proj.bias"),
            (
                "blk.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            ("token_embd.weight", "model.embed_tokens.weight"),
        ] {
            assert_eq!(hf_name(g, false).as_deref(), Some(h));
        }
        assert_eq!(hf_name("rope_freqs.weight", false), None);
    }
}
