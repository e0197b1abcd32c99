//! Hugging Face checkpoints: a directory with `config.json`, `tokenizer.json` and
//! `model.safetensors` (or shards `model-0000N-of-0000M.safetensors` named by
//! `model.safetensors.index.json`), presented to the rest of ppl as a [`GgufFile`]: the
//! hyper-parameters become GGUF metadata keys, the tensors get GGUF names and point into the
//! memory-mapped shards.
//!
//! Nothing is read at open beyond the JSON files and the safetensors headers; a rank reads
//! only the tensors (and, under tensor parallelism, the rows) its partition needs, straight
//! out of the maps. F32, F16 and BF16 tensors are used as stored (their layouts are GGUF's).
//!
//! Llama and Mistral store Q/K rows in the "rotate halves" order Hugging Face's rotary
//! embedding uses; llama.cpp's converter reorders them into adjacent pairs, and so do we on
//! read ([`RopePermute`]): a checkpoint and its GGUF conversion are the same numbers, and give
//! the same bits. Qwen2/Qwen3 keep Hugging Face's order in GGUF too (NeoX-style rotation).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use memmap2::Mmap;
use serde_json::Value as Json;

use super::arch::{Arch, SUPPORTED_MODEL_TYPES};
use super::gguf::{GgufError, GgufFile, RopePermute, TensorInfo, Value};
use super::rope_scaling::{RopeScaling, FREQ_FACTORS_KEY};
use super::tokenizer_meta::HfTokenizerFiles;

type Result<T> = std::result::Result<T, GgufError>;

/// The model files of a checkpoint directory that determine its results (for fingerprints).
pub fn checkpoint_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "json" || e == "safetensors")
        })
        .collect();
    files.sort();
    Ok(files)
}

fn invalid(path: &Path, detail: String) -> GgufError {
    GgufError::Checkpoint {
        path: path.to_path_buf(),
        detail,
    }
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|source| GgufError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| invalid(path, format!("not valid JSON: {e}")))
}

/// Opens a checkpoint directory.
pub fn open_dir(dir: &Path) -> Result<GgufFile> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(invalid(
            dir,
            "a directory is read as a Hugging Face checkpoint, but it has no config.json; pass a GGUF file or a checkpoint directory (config.json, tokenizer.json, *.safetensors)".into(),
        ));
    }
    let config = read_json(&config_path)?;
    let mut metadata = config_metadata(&config_path, &config, dir)?;
    let arch = match metadata.get("general.architecture") {
        Some(Value::String(s)) => Arch::from_gguf_name(s),
        _ => None,
    }
    .expect("config_metadata sets a supported architecture");

    // The shards: an index's weight map, or the single file.
    let index_path = dir.join("model.safetensors.index.json");
    let (shard_names, weight_map): (Vec<String>, Option<BTreeMap<String, String>>) = if index_path
        .is_file()
    {
        let index = read_json(&index_path)?;
        let map = index
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| invalid(&index_path, "no 'weight_map' object".into()))?;
        let mut wm = BTreeMap::new();
        for (k, v) in map {
            let file = v.as_str().ok_or_else(|| {
                invalid(&index_path, format!("weight_map['{k}'] is not a file name"))
            })?;
            wm.insert(k.clone(), file.to_string());
        }
        let mut names: Vec<String> = wm.values().cloned().collect();
        names.sort();
        names.dedup();
        (names, Some(wm))
    } else if dir.join("model.safetensors").is_file() {
        (vec!["model.safetensors".into()], None)
    } else {
        return Err(invalid(
                dir,
                "no model.safetensors and no model.safetensors.index.json: ppl reads safetensors checkpoints (convert .bin weights with transformers' save_pretrained(safe_serialization=True))".into(),
            ));
    };

    let mut maps = Vec::with_capacity(shard_names.len());
    let mut hf_tensors: BTreeMap<String, TensorInfo> = BTreeMap::new();
    for (file_index, name) in shard_names.iter().enumerate() {
        if name.contains('/') || name.contains("..") {
            return Err(invalid(
                &index_path,
                format!("shard name '{name}' leaves the checkpoint directory"),
            ));
        }
        let path = dir.join(name);
        let file = std::fs::File::open(&path).map_err(|source| GgufError::Open {
            path: path.clone(),
            source,
        })?;
        // SAFETY: read-only map of a file ppl never writes while it is mapped.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| GgufError::Open {
            path: path.clone(),
            source,
        })?;
        for info in safetensors_header(&path, &mmap, file_index)? {
            if let Some(wm) = &weight_map {
                if wm.get(&info.name) != Some(name) {
                    continue; // listed under another shard: the index decides
                }
            }
            hf_tensors.insert(info.name.clone(), info);
        }
        maps.push(mmap);
    }
    if let Some(wm) = &weight_map {
        if let Some((t, f)) = wm.iter().find(|(t, _)| !hf_tensors.contains_key(*t)) {
            return Err(invalid(
                &dir.join(f),
                format!("the index lists tensor '{t}' in this shard, but the shard does not hold it (a partial download?)"),
            ));
        }
    }

    let tied = match config.get("tie_word_embeddings").and_then(Json::as_bool) {
        Some(t) => t,
        None => !hf_tensors.contains_key("lm_head.weight"),
    };
    let head_dim = match metadata.get(&format!("{arch}.attention.key_length")) {
        Some(Value::U32(h)) => *h as usize,
        _ => unreachable!("config_metadata sets the head size"),
    };
    let permute = arch.hf_permutes_qk().then_some(RopePermute { head_dim });
    let mut tensors = BTreeMap::new();
    for (hf_name, mut info) in hf_tensors {
        let Some(name) = gguf_name(&hf_name, arch) else {
            tracing::debug!("{}: tensor '{hf_name}' is not used", dir.display());
            continue;
        };
        if name == "output.weight" && tied {
            continue;
        }
        if permute.is_some()
            && (name.ends_with(".attn_q.weight")
                || name.ends_with(".attn_k.weight")
                || name.ends_with(".attn_q.bias")
                || name.ends_with(".attn_k.bias"))
        {
            if info.shape[0] % head_dim != 0 {
                return Err(invalid(
                    dir,
                    format!(
                        "tensor '{hf_name}' has {} rows, not whole heads of {head_dim}",
                        info.shape[0]
                    ),
                ));
            }
            info.permute = permute;
        }
        info.name = name.clone();
        tensors.insert(name, info);
    }
    if !tied && !tensors.contains_key("output.weight") {
        return Err(invalid(
            dir,
            "config.json says tie_word_embeddings = false, but no shard holds lm_head.weight"
                .into(),
        ));
    }
    let name = config
        .get("_name_or_path")
        .and_then(Json::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    metadata.insert("general.name".into(), Value::String(name));
    let file_if = |n: &str| Some(dir.join(n)).filter(|p| p.is_file());
    let tokenizer = HfTokenizerFiles {
        tokenizer_json: file_if("tokenizer.json"),
        tokenizer_config: file_if("tokenizer_config.json"),
    };
    Ok(GgufFile::from_parts(
        dir,
        maps,
        metadata,
        tensors,
        Some(tokenizer),
    ))
}

/// GGUF's name for a Hugging Face tensor name, or `None` for tensors ppl does not use.
/// (Gemma's `post_attention_layernorm` normalises the attention output; its pre-MLP norm is
/// `pre_feedforward_layernorm`.)
fn gguf_name(hf: &str, arch: Arch) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let gemma = arch.is_gemma();
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "pre_feedforward_layernorm" if gemma => "ffn_norm",
        "post_feedforward_layernorm" if gemma => "post_ffw_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{short}.{kind}"))
}

/// The tensor directory of one safetensors file (8-byte header length, JSON header, data).
fn safetensors_header(path: &Path, bytes: &[u8], file: usize) -> Result<Vec<TensorInfo>> {
    let truncated = |what: String, offset: u64| GgufError::Truncated {
        path: path.to_path_buf(),
        what,
        offset,
        len: bytes.len() as u64,
    };
    if bytes.len() < 8 {
        return Err(truncated("the safetensors header length".into(), 0));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let data_start = 8u64
        .checked_add(n)
        .filter(|&e| e <= bytes.len() as u64)
        .ok_or_else(|| truncated(format!("a safetensors header of {n} bytes"), 8))?;
    let header: Json = serde_json::from_slice(&bytes[8..data_start as usize]).map_err(|e| {
        invalid(
            path,
            format!("the safetensors header is not valid JSON ({e}); is this a safetensors file?"),
        )
    })?;
    let obj = header
        .as_object()
        .ok_or_else(|| invalid(path, "the safetensors header is not a JSON object".into()))?;
    let mut out = Vec::with_capacity(obj.len());
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| invalid(path, format!("tensor '{name}': {what}"));
        let dtype_name = t
            .get("dtype")
            .and_then(Json::as_str)
            .ok_or_else(|| bad("no dtype"))?;
        let (dtype, type_id) = match dtype_name {
            "F32" => (GgmlDType::F32, 0),
            "F16" => (GgmlDType::F16, 1),
            "BF16" => (GgmlDType::BF16, 30),
            other => {
                return Err(bad(&format!(
                    "dtype {other} is not supported (ppl reads F32, F16 and BF16 checkpoints; save the model in one of them, e.g. model.to(torch.bfloat16).save_pretrained(...))"
                )))
            }
        };
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(Json::as_array)
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("shape is not a list of sizes"))?;
        let offsets: Vec<u64> = t
            .get("data_offsets")
            .and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<_>>>())
            .filter(|a| a.len() == 2 && a[0] <= a[1])
            .ok_or_else(|| bad("data_offsets is not [begin, end]"))?;
        let elems: u64 = shape.iter().map(|&d| d as u64).product();
        let size = offsets[1] - offsets[0];
        if size != elems * dtype.type_size() as u64 {
            return Err(bad(&format!(
                "{size} bytes of data for shape {shape:?} in {dtype_name}"
            )));
        }
        let offset = data_start + offsets[0];
        if offset + size > bytes.len() as u64 {
            return Err(truncated(
                format!("the data of tensor '{name}' ({size} bytes)"),
                offset,
            ));
        }
        out.push(TensorInfo {
            name: name.clone(),
            shape,
            type_id,
            dtype,
            offset,
            size,
            file,
            permute: None,
            transcode: None,
        });
    }
    Ok(out)
}

/// GGUF-style metadata (`general.architecture`, `{arch}.*`) from `config.json`.
fn config_metadata(path: &Path, c: &Json, dir: &Path) -> Result<BTreeMap<String, Value>> {
    let model_type = c
        .get("model_type")
        .and_then(Json::as_str)
        .ok_or_else(|| invalid(path, "no 'model_type'".into()))?;
    let Some(arch) = Arch::from_hf_model_type(model_type) else {
        return Err(GgufError::Checkpoint {
            path: dir.to_path_buf(),
            detail: format!(
                "model_type '{model_type}' is not supported; ppl reads Hugging Face checkpoints of: {SUPPORTED_MODEL_TYPES} (or a GGUF conversion of other models)"
            ),
        });
    };
    let gemma = arch.is_gemma();
    let (act, want) = if gemma {
        let a = c
            .get("hidden_activation")
            .or_else(|| c.get("hidden_act"))
            .and_then(Json::as_str)
            .unwrap_or("gelu_pytorch_tanh");
        (a, "gelu_pytorch_tanh")
    } else {
        (
            c.get("hidden_act").and_then(Json::as_str).unwrap_or("silu"),
            "silu",
        )
    };
    if act != want {
        return Err(invalid(
            path,
            format!(
                "hidden activation '{act}' is not supported for {arch} (ppl implements {want})"
            ),
        ));
    }
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if c.get(key).is_some_and(|v| !v.is_null()) {
            return Err(invalid(path, format!("{key} is not supported")));
        }
    }
    let missing = |key: &str| {
        invalid(
            path,
            format!("no '{key}' (needed for the {arch} hyper-parameters)"),
        )
    };
    let uint = |key: &str| -> Result<Option<u64>> {
        match c.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| invalid(path, format!("'{key}' is not a non-negative integer"))),
        }
    };
    let req = |key: &str| uint(key)?.ok_or_else(|| missing(key));
    let hidden = req("hidden_size")?;
    let heads = req("num_attention_heads")?;
    let kv_heads = uint("num_key_value_heads")?.unwrap_or(heads);
    if heads == 0 || hidden % heads != 0 && uint("head_dim")?.is_none() {
        return Err(invalid(
            path,
            format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
        ));
    }
    let head_dim = uint("head_dim")?.unwrap_or(hidden / heads);
    let float = |key: &str| -> Option<f64> { c.get(key).and_then(Json::as_f64) };
    // transformers 5 moved rope_theta into rope_parameters.
    // (Gemma 3 under transformers 5: one entry per layer type.)
    let rope_params = c.get("rope_parameters").filter(|v| v.is_object());
    let global_params = rope_params.map(|p| p.get("full_attention").unwrap_or(p));
    let local_params = rope_params.and_then(|p| p.get("sliding_attention"));
    let rope_theta = float("rope_theta")
        .or_else(|| {
            global_params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Json::as_f64)
        })
        .unwrap_or(10_000.0);
    let rope_theta_local = float("rope_local_base_freq")
        .or_else(|| {
            local_params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Json::as_f64)
        })
        .unwrap_or(10_000.0);
    // Rotary scaling of the global layers (the sliding layers of Gemma 3 are unscaled).
    let mut rope_scaling = None;
    for s in [
        c.get("rope_scaling").filter(|v| !v.is_null()),
        global_params,
    ]
    .into_iter()
    .flatten()
    {
        if let Some(found) = RopeScaling::from_config(s).map_err(|e| invalid(path, e))? {
            rope_scaling = Some(found);
        }
    }
    if let Some(s) = local_params {
        if let Some(found) = RopeScaling::from_config(s).map_err(|e| invalid(path, e))? {
            return Err(invalid(
                path,
                format!("rope scaling {found:?} on the sliding-window layers is not supported"),
            ));
        }
    }
    if arch == Arch::Qwen2 && c.get("use_sliding_window").and_then(Json::as_bool) == Some(true) {
        return Err(invalid(
            path,
            "use_sliding_window = true (Qwen2's per-layer sliding window) is not supported".into(),
        ));
    }
    let sliding_window = if arch.has_sliding_window() {
        uint("sliding_window")?
    } else {
        None
    };
    let n_layers = req("num_hidden_layers")?;
    // Gemma 3: which layers slide, from layer_types (or its period).
    let local_layers: Option<Vec<bool>> = match (gemma, sliding_window) {
        (true, Some(_)) => Some(match c.get("layer_types").and_then(Json::as_array) {
            Some(types) => {
                let flags: Vec<bool> = types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect();
                if flags.len() as u64 != n_layers {
                    return Err(invalid(
                        path,
                        format!(
                            "layer_types has {} entries for {n_layers} layers",
                            flags.len()
                        ),
                    ));
                }
                flags
            }
            None => {
                let n = uint("sliding_window_pattern")?.unwrap_or(6);
                (0..n_layers).map(|i| n == 0 || i % n < n - 1).collect()
            }
        }),
        _ => None,
    };
    let u32v = |v: u64| Value::U32(v as u32);
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: Value| {
        m.insert(format!("{arch}.{k}"), v);
    };
    put("embedding_length", u32v(hidden));
    put("feed_forward_length", u32v(req("intermediate_size")?));
    put("block_count", u32v(n_layers));
    put("attention.head_count", u32v(heads));
    put("attention.head_count_kv", u32v(kv_heads));
    put("attention.key_length", u32v(head_dim));
    put("rope.dimension_count", u32v(head_dim));
    put(
        "context_length",
        u32v(uint("max_position_embeddings")?.unwrap_or(4096)),
    );
    put(
        "attention.layer_norm_rms_epsilon",
        Value::F32(float("rms_norm_eps").ok_or_else(|| missing("rms_norm_eps"))? as f32),
    );
    put("rope.freq_base", Value::F32(rope_theta as f32));
    if let Some(scaling) = &rope_scaling {
        let factors = scaling.freq_factors(rope_theta, head_dim as usize);
        put(
            FREQ_FACTORS_KEY,
            Value::Array(factors.into_iter().map(Value::F32).collect()),
        );
    }
    if let Some(w) = sliding_window {
        put("attention.sliding_window", u32v(w));
    }
    if let Some(flags) = local_layers {
        put(
            "attention.sliding_window_pattern",
            Value::Array(flags.into_iter().map(Value::Bool).collect()),
        );
        put("rope.freq_base_swa", Value::F32(rope_theta_local as f32));
    }
    if gemma {
        let q = float("query_pre_attn_scalar").unwrap_or(head_dim as f64);
        put("attention.scale", Value::F32((1.0 / q.sqrt()) as f32));
        m.insert("ppl.norm_weight_plus_one".into(), Value::Bool(true));
    }
    m.insert(
        "general.architecture".into(),
        Value::String(arch.gguf_name().into()),
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_map_to_gguf() {
        assert_eq!(
            gguf_name(
                "model.layers.2.pre_feedforward_layernorm.weight",
                Arch::Gemma3
            )
            .as_deref(),
            Some("blk.2.ffn_norm.weight")
        );
        assert_eq!(
            gguf_name(
                "model.layers.2.post_attention_layernorm.weight",
                Arch::Gemma3
            )
            .as_deref(),
            Some("blk.2.post_attention_norm.weight")
        );
        assert_eq!(
            gguf_name(
                "model.layers.2.post_attention_layernorm.weight",
                Arch::Llama
            )
            .as_deref(),
            Some("blk.2.ffn_norm.weight")
        );
        assert_eq!(
            gguf_name("model.layers.11.self_attn.q_proj.bias", Arch::Llama).as_deref(),
            Some("blk.11.attn_q.bias")
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight", Arch::Llama).as_deref(),
            Some("blk.0.ffn_down.weight")
        );
        assert_eq!(
            gguf_name("model.layers.3.self_attn.k_norm.weight", Arch::Llama).as_deref(),
            Some("blk.3.attn_k_norm.weight")
        );
        assert_eq!(
            gguf_name("model.embed_tokens.weight", Arch::Llama).as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq", Arch::Llama),
            None
        );
        assert_eq!(gguf_name("vision_tower.x.weight", Arch::Llama), None);
    }

    #[test]
    fn rope_permutation_pairs_the_halves() {
        // One head of 4 rows [a0 a1 | b0 b1] becomes [a0 b0 a1 b1]; 1-byte rows.
        let p = RopePermute { head_dim: 4 };
        assert_eq!(
            p.apply(&[0, 1, 2, 3, 10, 11, 12, 13], 1),
            vec![0, 2, 1, 3, 10, 12, 11, 13]
        );
    }
}
