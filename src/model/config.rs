//! [`LlamaConfig`]: the hyper-parameters of the five families, read from GGUF metadata.
//! Below both the layers (`model::llama`) and the sharding plan (`model::shard`), which
//! each read it.

use crate::model::arch::{Arch, SUPPORTED_ARCHITECTURES};
use crate::model::gguf::GgufFile;
use crate::model::ModelError;

type Result<T> = std::result::Result<T, ModelError>;

/// Hyper-parameters, read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlamaConfig {
    #[serde(rename = "architecture")]
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub context_length: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_dim: usize,
    pub tied_embeddings: bool,
    /// Rotation of each head's two halves (NeoX, Qwen) rather than of adjacent pairs
    /// (Llama as GGUF stores it).
    pub rope_neox: bool,
    /// Biases on the Q, K and V projections (Qwen2).
    pub attn_bias: bool,
    /// A bias on the attention output projection (Llama with `attention_bias`).
    pub attn_output_bias: bool,
    /// RMSNorm of each Q and K head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Positions a token attends to, itself included (Mistral; Gemma 3's local layers);
    /// `None`: all before it.
    pub sliding_window: Option<usize>,
    /// Gemma 3: which layers use the sliding window and [`LlamaConfig::rope_theta_local`]
    /// (empty: every layer when there is a window, as in Mistral).
    pub local_layers: Vec<bool>,
    /// RoPE base of the sliding-window layers (Gemma 3).
    pub rope_theta_local: f64,
    /// Scale of the attention scores; `None`: 1/√head_dim.
    pub attention_scale: Option<f64>,
    /// Norm weights stored as `w` for a scale of `1 + w` (Gemma's Hugging Face checkpoints;
    /// GGUF conversions store `1 + w`).
    pub norm_weight_plus_one: bool,
}

impl LlamaConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let name = g.get_str("general.architecture", "which architecture the model has")?;
        let Some(arch) = Arch::from_gguf_name(name) else {
            return Err(ModelError::UnsupportedArchitecture {
                path: g.path().to_path_buf(),
                arch: name.to_string(),
                supported: SUPPORTED_ARCHITECTURES,
            });
        };
        let purpose = "the Llama hyper-parameters";
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| -> Result<usize> { Ok(g.get_u64(&key(k), purpose)? as usize) };
        let hidden_size = get("embedding_length")?;
        let n_heads = get("attention.head_count")?;
        let n_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(_) => get("attention.head_count_kv")?,
            None => n_heads,
        };
        let invalid = |detail: String| ModelError::Invalid {
            path: g.path().to_path_buf(),
            detail,
        };
        if n_heads == 0
            || n_kv_heads == 0
            || hidden_size % n_heads != 0
            || n_heads % n_kv_heads != 0
        {
            return Err(invalid(format!(
                "inconsistent attention metadata: hidden {hidden_size}, heads {n_heads}, kv heads {n_kv_heads}"
            )));
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(_) => get("attention.key_length")?,
            None => hidden_size / n_heads,
        };
        let rope_dim = match g.get(&key("rope.dimension_count")) {
            Some(_) => get("rope.dimension_count")?,
            None => head_dim,
        };
        if rope_dim != head_dim || head_dim % 2 != 0 {
            return Err(invalid(format!(
                "partial or odd rotary embeddings (rope dim {rope_dim}, head dim {head_dim}) are not supported"
            )));
        }
        let embd = g.tensor_info("token_embd.weight", "the token embedding is required")?;
        let vocab_size = match embd.shape.as_slice() {
            [v, d] if *d == hidden_size => *v,
            other => {
                return Err(invalid(format!(
                    "token_embd.weight has shape {other:?}, expected [vocab, {hidden_size}]"
                )))
            }
        };
        let rope_theta = match g.get(&key("rope.freq_base")) {
            Some(_) => g.get_f64(&key("rope.freq_base"), purpose)?,
            None => 10_000.0,
        };
        let gemma = arch.is_gemma();
        let sliding_window = match g.get(&key("attention.sliding_window")) {
            Some(_) if arch.has_sliding_window() => Some(get("attention.sliding_window")?),
            _ => None,
        }
        .filter(|&w| !(gemma && w == 0));
        // llama.cpp: five local layers for each global one unless the file says otherwise
        // (a period, or one flag per layer).
        let n_layers = get("block_count")?;
        let local_layers = match (gemma, sliding_window) {
            (true, Some(_)) => match g.get(&key("attention.sliding_window_pattern")) {
                Some(crate::model::gguf::Value::Array(flags)) => {
                    let flags: Vec<bool> = flags
                        .iter()
                        .map(|f| matches!(f, crate::model::gguf::Value::Bool(true)))
                        .collect();
                    if flags.len() != n_layers {
                        return Err(invalid(format!(
                            "attention.sliding_window_pattern has {} flags for {n_layers} layers",
                            flags.len()
                        )));
                    }
                    flags
                }
                other => {
                    let n = match other {
                        Some(_) => get("attention.sliding_window_pattern")?,
                        None => 6,
                    };
                    (0..n_layers).map(|i| n == 0 || i % n < n - 1).collect()
                }
            },
            _ => Vec::new(),
        };
        let attention_scale = match g.get(&key("attention.scale")) {
            Some(_) => Some(g.get_f64(&key("attention.scale"), purpose)?),
            // llama.cpp: Gemma 3 27B scales by hidden/heads rather than the head size.
            None if gemma && n_layers == 62 => Some(1.0 / ((hidden_size / n_heads) as f64).sqrt()),
            None => None,
        };
        let rope_theta_local = match g.get(&key("rope.freq_base_swa")) {
            Some(_) => g.get_f64(&key("rope.freq_base_swa"), purpose)?,
            None => 10_000.0,
        };
        if sliding_window == Some(0) {
            return Err(invalid("a sliding window of 0 positions".into()));
        }
        // Zeros here would surface later as advice to use "--pp 0" or "--ctx 0": the file's
        // metadata is what is wrong, and no flag can fix it.
        let context_length = get("context_length")?;
        for (what, value) in [
            ("block_count", n_layers),
            ("context_length", context_length),
        ] {
            if value == 0 {
                return Err(invalid(format!(
                    "{arch}.{what} is 0, which no model has: the file's metadata is broken; re-download or re-convert the model"
                )));
            }
        }
        let has = |n: &str| g.tensors.contains_key(n);
        Ok(Self {
            local_layers,
            rope_theta_local,
            attention_scale,
            norm_weight_plus_one: g.get_bool("ppl.norm_weight_plus_one") == Some(true),
            rope_neox: arch.rope_neox(),
            attn_bias: has("blk.0.attn_q.bias"),
            attn_output_bias: has("blk.0.attn_output.bias"),
            qk_norm: has("blk.0.attn_q_norm.weight"),
            sliding_window,
            vocab_size,
            hidden_size,
            intermediate_size: get("feed_forward_length")?,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            context_length,
            rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"), purpose)?,
            rope_theta,
            rope_dim,
            tied_embeddings: !g.tensors.contains_key("output.weight"),
            arch,
        })
    }

    /// Whether layer `i` attends through the sliding window (and which RoPE base it uses).
    pub fn is_local(&self, i: usize) -> bool {
        match self.sliding_window {
            Some(_) if !self.local_layers.is_empty() => self.local_layers.get(i) == Some(&true),
            Some(_) => true,
            None => false,
        }
    }

    /// Parameter count (embeddings counted once when tied).
    pub fn parameters(&self) -> u64 {
        let d = self.hidden_size as u64;
        let q = (self.n_heads * self.head_dim) as u64;
        let kv = (self.n_kv_heads * self.head_dim) as u64;
        let ff = self.intermediate_size as u64;
        let hd = self.head_dim as u64;
        let per_layer = d * q
            + 2 * d * kv
            + q * d
            + 3 * d * ff
            + 2 * d
            + if self.attn_bias { q + 2 * kv } else { 0 }
            + if self.attn_output_bias { d } else { 0 }
            + if self.qk_norm { 2 * hd } else { 0 }
            + if self.arch.is_gemma() { 2 * d } else { 0 };
        let embed = self.vocab_size as u64 * d;
        embed * if self.tied_embeddings { 1 } else { 2 } + per_layer * self.n_layers as u64 + d
    }
}
