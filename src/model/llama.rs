//! The Llama family (Llama 2/3, SmolLM, TinyLlama, …): RoPE, grouped-query attention, RMSNorm,
//! SwiGLU, tied or separate output embedding. Hyper-parameters come from GGUF metadata.
//!
//! Unlike candle-transformers' quantized Llama, this forward pass keeps every position: it
//! returns the final hidden states of a batch of windows, and [`Llama::logits`] projects any
//! selection of them onto the vocabulary. Each window in a batch is independent (causal mask
//! per window, per-row matmuls), so a window's logits do not depend on its batch-mates.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::sync::Arc;

use super::gguf::GgufFile;
use super::kernels::q4_1::Q4_1Matrix;
use super::{ModelError, Precision};

type Result<T> = std::result::Result<T, ModelError>;

/// Architectures this file implements (GGUF `general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &str = "llama";

/// Hyper-parameters, read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlamaConfig {
    pub architecture: String,
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
}

impl LlamaConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g
            .get_str("general.architecture", "which architecture the model has")?
            .to_string();
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture {
                path: g.path().to_path_buf(),
                arch,
                supported: SUPPORTED_ARCHITECTURES,
            });
        }
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
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size: get("feed_forward_length")?,
            n_layers: get("block_count")?,
            n_heads,
            n_kv_heads,
            head_dim,
            context_length: get("context_length")?,
            rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"), purpose)?,
            rope_theta,
            rope_dim,
            tied_embeddings: !g.tensors.contains_key("output.weight"),
            architecture: arch,
        })
    }

    /// Parameter count (embeddings counted once when tied).
    pub fn parameters(&self) -> u64 {
        let d = self.hidden_size as u64;
        let q = (self.n_heads * self.head_dim) as u64;
        let kv = (self.n_kv_heads * self.head_dim) as u64;
        let ff = self.intermediate_size as u64;
        let per_layer = d * q + 2 * d * kv + q * d + 3 * d * ff + 2 * d;
        let embed = self.vocab_size as u64 * d;
        embed * if self.tied_embeddings { 1 } else { 2 } + per_layer * self.n_layers as u64 + d
    }
}

/// A weight matrix used as `x @ W^T`: candle's quantized or dense matmul, or our AVX2 Q4_1
/// kernel where candle has no SIMD path (see [`super::kernels`]).
enum Linear {
    Candle(QMatMul),
    Q4_1(Q4_1Matrix),
}

impl Linear {
    fn load(g: &GgufFile, name: &str, shape: &[usize], precision: Precision) -> Result<Self> {
        let info = g.tensor_info(name, "the model's architecture requires it")?;
        if precision == Precision::Native && info.dtype == GgmlDType::Q4_1 && shape.len() == 2 {
            let (info, bytes) = g.tensor_data(name, shape)?;
            let m = Q4_1Matrix::from_bytes(bytes, shape[0], shape[1]).ok_or_else(|| {
                ModelError::Invalid {
                    path: g.path().to_path_buf(),
                    detail: format!("tensor '{name}' has a malformed Q4_1 layout"),
                }
            })?;
            g.release(info);
            return Ok(Linear::Q4_1(m));
        }
        let q = g.qtensor(name, shape, &Device::Cpu)?;
        Self::from_qtensor(Arc::new(q), precision)
    }

    fn from_qtensor(q: Arc<QTensor>, precision: Precision) -> Result<Self> {
        Ok(Linear::Candle(match precision {
            // QMatMul keeps quantized types quantized and dequantizes F32/F16/BF16 to f32.
            Precision::Native => QMatMul::from_arc(q)?,
            Precision::F32 => QMatMul::Tensor(q.dequantize(&Device::Cpu)?),
        }))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Q4_1(w) => {
                let (n, k) = w.shape();
                let mut dims = x.dims().to_vec();
                let rows = x.elem_count() / k;
                let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                let y = w.matmul(&xs, rows);
                *dims.last_mut().expect("rank >= 1") = n;
                Ok(Tensor::from_vec(y, dims, &Device::Cpu)?)
            }
        }
    }
}

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(g: &GgufFile, name: &str, dim: usize, eps: f64) -> Result<Self> {
        let weight = g
            .qtensor(name, &[dim], &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps,
        )?)
    }
}

/// Token embedding lookup: quantized rows dequantized on lookup, or a dense table.
enum Embedding {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Quantized(q) => q.embedding(ids)?,
            Embedding::Dense(t) => {
                let (b, s) = ids.dims2()?;
                t.index_select(&ids.flatten_all()?, 0)?
                    .reshape((b, s, t.dim(1)?))?
            }
        })
    }
}

struct Attention {
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            Ok(y.reshape((b, t, n, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = rope.apply(&heads(self.wq.forward(x)?, self.n_heads)?)?;
        let k = rope.apply(&heads(self.wk.forward(x)?, self.n_kv_heads)?)?;
        let v = heads(self.wv.forward(x)?, self.n_kv_heads)?;
        let (k, v) = (self.repeat_kv(k)?, self.repeat_kv(v)?);
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let y = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, self.n_heads * self.head_dim))?;
        self.wo.forward(&y)
    }

    /// Grouped-query attention: each KV head serves `n_heads / n_kv_heads` query heads.
    fn repeat_kv(&self, x: Tensor) -> Result<Tensor> {
        let rep = self.n_heads / self.n_kv_heads;
        if rep == 1 {
            return Ok(x);
        }
        let (b, kv, t, d) = x.dims4()?;
        Ok(x.unsqueeze(2)?
            .broadcast_as((b, kv, rep, t, d))?
            .reshape((b, kv * rep, t, d))?)
    }
}

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = (self.gate.forward(x)?.silu()? * self.up.forward(x)?)?;
        self.down.forward(&h)
    }
}

struct Block {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    fn load(g: &GgufFile, c: &LlamaConfig, i: usize, precision: Precision) -> Result<Self> {
        let name = |n: &str| format!("blk.{i}.{n}.weight");
        let d = c.hidden_size;
        let q = c.n_heads * c.head_dim;
        let kv = c.n_kv_heads * c.head_dim;
        let ff = c.intermediate_size;
        let lin = |n: &str, shape: &[usize]| Linear::load(g, &name(n), shape, precision);
        Ok(Self {
            attn_norm: RmsNorm::load(g, &name("attn_norm"), d, c.rms_norm_eps)?,
            attn: Attention {
                wq: lin("attn_q", &[q, d])?,
                wk: lin("attn_k", &[kv, d])?,
                wv: lin("attn_v", &[kv, d])?,
                wo: lin("attn_output", &[d, q])?,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
            },
            ffn_norm: RmsNorm::load(g, &name("ffn_norm"), d, c.rms_norm_eps)?,
            mlp: Mlp {
                gate: lin("ffn_gate", &[ff, d])?,
                up: lin("ffn_up", &[ff, d])?,
                down: lin("ffn_down", &[d, ff])?,
            },
        })
    }

    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let h = (x + self.attn.forward(&self.attn_norm.forward(x)?, rope, mask)?)?;
        Ok((&h + self.mlp.forward(&self.ffn_norm.forward(&h)?)?)?)
    }
}

/// Rotary position embedding on adjacent pairs (llama.cpp's "normal" RoPE; GGUF stores Q/K
/// rows permuted for it).
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    fn new(c: &LlamaConfig, freq_factors: Option<Vec<f32>>) -> Result<Self> {
        let half = c.rope_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let f = 1.0 / c.rope_theta.powf(2.0 * i as f64 / c.rope_dim as f64);
                let factor = freq_factors.as_ref().map_or(1.0, |v| v[i] as f64);
                (f / factor) as f32
            })
            .collect();
        let n = c.context_length;
        let mut angles = Vec::with_capacity(n * half);
        for p in 0..n {
            for &f in &inv_freq {
                angles.push(p as f32 * f);
            }
        }
        let angles = Tensor::from_vec(angles, (n, half), &Device::Cpu)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }

    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(2)?;
        Ok(candle_nn::rotary_emb::rope_i(
            x,
            &self.cos.narrow(0, 0, t)?,
            &self.sin.narrow(0, 0, t)?,
        )?)
    }
}

/// A Llama-family model ready to score windows.
pub struct Llama {
    pub config: LlamaConfig,
    precision: Precision,
    embedding: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    output: Linear,
    rope: Rope,
}

impl Llama {
    /// Builds the model from a parsed GGUF file, loading every weight once.
    pub fn from_gguf(g: &GgufFile, precision: Precision) -> Result<Self> {
        let config = LlamaConfig::from_gguf(g)?;
        let (v, d) = (config.vocab_size, config.hidden_size);
        let embd = Arc::new(g.qtensor("token_embd.weight", &[v, d], &Device::Cpu)?);
        let (embedding, output) = match precision {
            Precision::F32 => {
                let dense = embd.dequantize(&Device::Cpu)?;
                let output = if config.tied_embeddings {
                    Linear::Candle(QMatMul::Tensor(dense.clone()))
                } else {
                    Linear::load(g, "output.weight", &[v, d], precision)?
                };
                (Embedding::Dense(dense), output)
            }
            Precision::Native => {
                let output = if config.tied_embeddings {
                    Linear::from_qtensor(embd.clone(), precision)?
                } else {
                    Linear::load(g, "output.weight", &[v, d], precision)?
                };
                let embedding = if embd.dtype().block_size() == 1 {
                    Embedding::Dense(embd.dequantize(&Device::Cpu)?)
                } else {
                    Embedding::Quantized(embd)
                };
                (embedding, output)
            }
        };
        let blocks = (0..config.n_layers)
            .map(|i| Block::load(g, &config, i, precision))
            .collect::<Result<Vec<_>>>()?;
        let freq_factors = match g.tensors.get("rope_freqs.weight") {
            Some(_) => Some(
                g.qtensor("rope_freqs.weight", &[config.rope_dim / 2], &Device::Cpu)?
                    .dequantize(&Device::Cpu)?
                    .to_vec1::<f32>()?,
            ),
            None => None,
        };
        Ok(Self {
            norm: RmsNorm::load(g, "output_norm.weight", d, config.rms_norm_eps)?,
            rope: Rope::new(&config, freq_factors)?,
            config,
            precision,
            embedding,
            blocks,
            output,
        })
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Final (normalised) hidden states `[batch, seq, hidden]` for token ids `[batch, seq]`.
    pub fn hidden_states(&self, ids: &Tensor) -> Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let mask = causal_mask(t)?;
        let mut x = self.embedding.forward(ids)?;
        for block in &self.blocks {
            x = block.forward(&x, &self.rope, &mask)?;
        }
        self.norm.forward(&x)
    }

    /// Logits `[.., vocab]` (f32) for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let y = self.output.forward(&hidden.contiguous()?)?;
        Ok(y.to_dtype(DType::F32)?)
    }

    /// Logits for every position: `[batch, seq, vocab]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(&self.hidden_states(ids)?)
    }
}

/// `[t, t]` additive mask: 0 on and below the diagonal, -inf above.
fn causal_mask(t: usize) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Ok(Tensor::from_vec(mask, (t, t), &Device::Cpu)?)
}
