//! The Llama family (Llama 2/3, SmolLM, TinyLlama, …): RoPE, grouped-query attention, RMSNorm,
//! SwiGLU, tied or separate output embedding. Hyper-parameters come from GGUF metadata (or a
//! Hugging Face `config.json`, see [`super::hf`]).
//!
//! The close relatives are the same blocks with one difference each, selected by
//! [`LlamaConfig`]:
//! - **Mistral**: sliding-window attention (a position sees the last `sliding_window` ones).
//! - **Qwen2/2.5**: biases on the Q, K and V projections; NeoX-style rotation (halves).
//! - **Qwen3**: RMSNorm of each Q and K head before the rotation; NeoX-style rotation.
//! - **Gemma 3**: embeddings scaled by √hidden, Q/K head norms, norms after attention and
//!   after the MLP too, GELU (tanh) gating, and five sliding-window layers (their own RoPE
//!   base) for every global one.
//!
//! Unlike candle-transformers' quantized Llama, this forward pass keeps every position: it
//! returns the final hidden states of a batch of windows, and [`Llama::logits`] projects any
//! selection of them onto the vocabulary. Each window in a batch is independent (causal mask
//! per window, per-row matmuls), so a window's logits do not depend on its batch-mates.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::gguf::GgufFile;
use super::kernels::{self, attention, math, OwnMatrix};
use super::quantize::{self, Quantize, Quantized, Site};
use super::ring_attention::ContextParallel;
use super::shard::{self, LayerShard, Partition, RawTensor, TensorSpec};
use super::{ModelError, Precision};

type Result<T> = std::result::Result<T, ModelError>;

/// Architectures this file implements (GGUF `general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &str = "llama, mistral, qwen2, qwen3, gemma3";

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
    /// Gemma's block: √hidden embedding scale, post-attention and post-MLP norms, GELU.
    pub gemma: bool,
    /// Scale of the attention scores; `None`: 1/√head_dim.
    pub attention_scale: Option<f64>,
    /// Norm weights stored as `w` for a scale of `1 + w` (Gemma's Hugging Face checkpoints;
    /// GGUF conversions store `1 + w`).
    pub norm_weight_plus_one: bool,
}

impl LlamaConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g
            .get_str("general.architecture", "which architecture the model has")?
            .to_string();
        if !["llama", "mistral", "qwen2", "qwen3", "gemma3"].contains(&arch.as_str()) {
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
        let gemma = arch == "gemma3";
        let sliding_window = match g.get(&key("attention.sliding_window")) {
            Some(_) if arch == "mistral" || gemma => Some(get("attention.sliding_window")?),
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
            gemma,
            rope_neox: matches!(arch.as_str(), "qwen2" | "qwen3" | "gemma3"),
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
            architecture: arch,
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
            + if self.gemma { 2 * d } else { 0 };
        let embed = self.vocab_size as u64 * d;
        embed * if self.tied_embeddings { 1 } else { 2 } + per_layer * self.n_layers as u64 + d
    }
}

/// A weight matrix used as `x @ W^T`: candle's quantized or dense matmul, or one of our
/// kernels where a benchmark showed candle's to be the bottleneck ([`kernels::own_matrix`]
/// picks it).
enum Linear {
    Candle(QMatMul),
    Own(Arc<dyn OwnMatrix>),
}

impl Linear {
    /// Builds the matrix from its stored bytes (the one copy out of the map).
    fn from_raw(
        raw: &RawTensor<'_>,
        name: &str,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        if own_kernels(precision, kernels) {
            if let Some(own) = Self::own(raw.dtype, &raw.bytes, &raw.shape, name)? {
                return Ok(own);
            }
        }
        let q = Arc::new(qtensor(raw, name, device)?);
        Self::from_qtensor(q, name, precision, device, kernels)
    }

    /// Our kernel for a stored `[n, k]` matrix, if one serves its type.
    fn own(dtype: GgmlDType, bytes: &[u8], shape: &[usize], name: &str) -> Result<Option<Self>> {
        let [n, k] = *shape else { return Ok(None) };
        match kernels::own_matrix(dtype, bytes, n, k) {
            None => Ok(None),
            Some(Ok(m)) => Ok(Some(Linear::Own(m))),
            Some(Err(detail)) => Err(ModelError::Tensor {
                name: name.to_string(),
                detail: format!("has {detail}"),
            }),
        }
    }

    /// A weight quantized at load (`--quantize`): int4/int8 become their dequantized f32
    /// values (a weight-only kernel's exact operands), GGUF types are used as such (our Q4_1
    /// kernel for Q4_1 in native precision).
    fn quantized(
        raw: &RawTensor<'_>,
        site: &Site,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
        q: &Quantize,
    ) -> Result<Self> {
        let name = site.name;
        // Quantized on the host (the schemes are CPU code), then placed on `device`.
        let w = qtensor(raw, name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
        let err = |e: candle_core::Error| ModelError::Tensor {
            name: name.to_string(),
            detail: format!("cannot quantize it to {}: {e}", q.scheme),
        };
        match quantize::quantize(q, &w, site).map_err(err)? {
            Quantized::Dense(t) => Ok(Linear::Candle(QMatMul::Tensor(
                t.to_dtype(precision.dtype())?.to_device(device)?,
            ))),
            Quantized::Ggml(qt) => Self::from_qtensor(qt, name, precision, device, kernels),
        }
    }

    /// A matrix from candle storage (on the host or already on `device`).
    fn from_qtensor(
        q: Arc<QTensor>,
        name: &str,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        if own_kernels(precision, kernels) {
            if let Some(own) = Self::own(q.dtype(), &q.data()?, q.shape().dims(), name)? {
                return Ok(own);
            }
        }
        let q = place_qtensor(q, device)?;
        Ok(Linear::Candle(match precision {
            // QMatMul keeps quantized types quantized (on a GPU: candle's CUDA kernels, which
            // quantize the activations to Q8_1 as llama.cpp's do) and dequantizes
            // F32/F16/BF16 to f32.
            Precision::Native => QMatMul::from_arc(q)?,
            p => QMatMul::Tensor(q.dequantize(device)?.to_dtype(p.dtype())?),
        }))
    }

    /// Bytes held.
    fn bytes(&self) -> u64 {
        (match self {
            Linear::Own(m) => m.storage_bytes(),
            Linear::Candle(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Linear::Candle(QMatMul::Tensor(t)) | Linear::Candle(QMatMul::TensorF16(t)) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }) as u64
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            // Dense weights set the activations' dtype (f32 rows meet a bf16 output layer
            // when a compare reads stored hidden states).
            Linear::Candle(m @ QMatMul::Tensor(w)) => Ok(m.forward(&x.to_dtype(w.dtype())?)?),
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Own(w) => own_kernel(x, w.shape(), |xs, rows| w.matmul(xs, rows)),
        }
    }
}

/// Runs `f` on the f32 values of `t` in row-major order, without a copy when `t` is already a
/// contiguous CPU f32 tensor.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    use candle_core::{CpuStorage, Storage};
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) => Ok(f(&v[start..end])),
        _ => {
            drop(storage);
            Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
        }
    }
}

/// `x [.., k]` through one of our kernels of shape `(n, k)`: `[.., n]`.
fn own_kernel(
    x: &Tensor,
    (n, k): (usize, usize),
    matmul: impl Fn(&[f32], usize) -> Vec<f32>,
) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / k;
    let y = with_f32(x, |xs| matmul(xs, rows))?;
    *dims.last_mut().expect("rank >= 1") = n;
    Ok(Tensor::from_vec(y, dims, &Device::Cpu)?)
}

/// Which code computes the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Our kernels where a benchmark chose them (quantized matmuls in native precision, f32
    /// attention, SiLU), candle's ops elsewhere: the CPU's default.
    Own,
    /// candle's ops throughout: what runs on a GPU. On the CPU it checks the GPU's path
    /// against ours.
    Candle,
}

impl Kernels {
    /// The default for `device` (our kernels are CPU code).
    pub fn for_device(device: &Device) -> Self {
        if device.is_cpu() {
            Kernels::Own
        } else {
            Kernels::Candle
        }
    }
}

/// How a rank computes: the weights' precision, where, and with which kernels.
#[derive(Clone, Copy)]
struct Compute<'a> {
    precision: Precision,
    device: &'a Device,
    kernels: Kernels,
}

/// Whether our quantized matmuls take the weights (they serve native precision only).
fn own_kernels(precision: Precision, kernels: Kernels) -> bool {
    precision == Precision::Native && kernels == Kernels::Own
}

/// Candle storage for stored bytes, on `device`.
fn qtensor(raw: &RawTensor<'_>, name: &str, device: &Device) -> Result<QTensor> {
    let err = |e: candle_core::Error| ModelError::Tensor {
        name: name.to_string(),
        detail: e.to_string(),
    };
    let storage =
        QStorage::from_data(Cow::Borrowed(&raw.bytes[..]), device, raw.dtype).map_err(err)?;
    QTensor::new(storage, raw.shape.as_slice()).map_err(err)
}

/// `q` on `device`: the same quantized bytes, copied once when it lives elsewhere.
fn place_qtensor(q: Arc<QTensor>, device: &Device) -> Result<Arc<QTensor>> {
    if q.device().same_device(device) {
        return Ok(q);
    }
    let storage = QStorage::from_data(q.data()?, device, q.dtype())?;
    Ok(Arc::new(QTensor::new(storage, q.shape().clone())?))
}

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn from_raw(raw: &RawTensor<'_>, name: &str, c: &LlamaConfig, device: &Device) -> Result<Self> {
        let w = qtensor(raw, name, device)?.dequantize(device)?;
        Ok(Self {
            // In f32, as transformers computes `1.0 + weight.float()`.
            weight: if c.norm_weight_plus_one {
                (w + 1.0)?
            } else {
                w
            },
            eps: c.rms_norm_eps as f32,
        })
    }

    fn load(g: &GgufFile, name: &str, c: &LlamaConfig, device: &Device) -> Result<Self> {
        let raw = shard::read(g, &TensorSpec::whole(name.to_string(), &[c.hidden_size]))?;
        Self::from_raw(&raw, name, c, device)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight.to_dtype(x.dtype())?,
            self.eps,
        )?)
    }
}

/// Token embedding lookup: quantized rows dequantized on lookup, or a dense table. Under
/// tensor parallelism a rank holds the rows `vocab` of the table; other ids give zero rows
/// (the all-reduce that follows adds the owner's row to zeros, exactly).
struct Embedding {
    table: EmbeddingTable,
    vocab: Range<usize>,
    full_vocab: usize,
}

enum EmbeddingTable {
    Quantized(Arc<QTensor>),
    /// The tied output layer's copy held for our kernels, decoded a row at a time (native
    /// precision).
    Own(Arc<dyn OwnMatrix>),
    Dense(Tensor),
}

impl Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let sharded = self.vocab.len() != self.full_vocab;
        let (ids, keep) = if sharded {
            let flat = ids.flatten_all()?.to_vec1::<u32>()?;
            let local: Vec<u32> = flat
                .iter()
                .map(|&t| {
                    let t = t as usize;
                    if self.vocab.contains(&t) {
                        (t - self.vocab.start) as u32
                    } else {
                        0
                    }
                })
                .collect();
            let keep: Vec<f32> = flat
                .iter()
                .map(|&t| f32::from(u8::from(self.vocab.contains(&(t as usize)))))
                .collect();
            (
                Tensor::from_vec(local, (b, s), ids.device())?,
                Some(Tensor::from_vec(keep, (b, s, 1), ids.device())?),
            )
        } else {
            (ids.clone(), None)
        };
        let x = match &self.table {
            EmbeddingTable::Quantized(q) => q.embedding(&ids)?,
            EmbeddingTable::Own(m) => {
                let k = m.shape().1;
                let ids = ids.flatten_all()?.to_vec1::<u32>()?;
                let mut rows = vec![0f32; ids.len() * k];
                for (row, &id) in rows.chunks_exact_mut(k).zip(&ids) {
                    m.dequantize_row(id as usize, row);
                }
                Tensor::from_vec(rows, (b, s, k), &Device::Cpu)?
            }
            EmbeddingTable::Dense(t) => {
                t.index_select(&ids.flatten_all()?, 0)?
                    .reshape((b, s, t.dim(1)?))?
            }
        };
        Ok(match keep {
            Some(k) => x.broadcast_mul(&k.to_dtype(x.dtype())?)?,
            None => x,
        })
    }

    fn bytes(&self) -> u64 {
        (match &self.table {
            EmbeddingTable::Quantized(q) => q.storage_size_in_bytes(),
            EmbeddingTable::Own(m) => m.storage_bytes(),
            EmbeddingTable::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        }) as u64
    }
}

/// Sum of a tensor over the tensor-parallel group (every rank gets the same sum).
pub type AllReduce<'a> = &'a (dyn Fn(Tensor) -> Result<Tensor> + Sync);
/// Every FSDP piece of a layer, in rank order, from this rank's piece.
pub type AllGather<'a> = &'a (dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>> + Sync);

/// Collective operations the forward pass needs when the model is split across ranks.
pub struct Collectives<'a> {
    pub tp_all_reduce: Option<AllReduce<'a>>,
    pub fsdp_all_gather: Option<AllGather<'a>>,
    /// The window's positions split across context-parallel ranks: RoPE at this rank's
    /// absolute positions, attention by a ring over the group.
    pub context_parallel: Option<&'a dyn ContextParallel>,
}

impl Collectives<'_> {
    pub const NONE: Collectives<'static> = Collectives {
        tp_all_reduce: None,
        fsdp_all_gather: None,
        context_parallel: None,
    };

    fn reduce(&self, x: Tensor) -> Result<Tensor> {
        match self.tp_all_reduce {
            Some(f) => f(x),
            None => Ok(x),
        }
    }
}

struct Attention {
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    /// Q/K/V biases (Qwen2), this rank's rows.
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    /// Output bias: added by one tensor-parallel rank only (the others' partial sums must
    /// not carry it again).
    bo: Option<Tensor>,
    /// Per-head RMSNorm of Q and K (Qwen3).
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// Heads held by this rank (all of them without tensor parallelism).
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Multiplies Q·K (1/√head_dim unless the model says otherwise).
    scale: f64,
    /// f32 attention through our fused kernel ([`Kernels::Own`]).
    fused: bool,
}

/// `y + bias` broadcast over the rows, in `y`'s dtype.
fn add_bias(y: Tensor, bias: &Option<Tensor>) -> Result<Tensor> {
    Ok(match bias {
        Some(b) => y.broadcast_add(&b.to_dtype(y.dtype())?)?,
        None => y,
    })
}

impl Attention {
    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Mask, cc: &Collectives) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            Ok(y.reshape((b, t, n, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let norm = |y: Tensor, n: &Option<RmsNorm>| -> Result<Tensor> {
            match n {
                Some(n) => n.forward(&y),
                None => Ok(y),
            }
        };
        let q = heads(add_bias(self.wq.forward(x)?, &self.bq)?, self.n_heads)?;
        let k = heads(add_bias(self.wk.forward(x)?, &self.bk)?, self.n_kv_heads)?;
        let cp = cc.context_parallel;
        let q = rope.apply(&norm(q, &self.q_norm)?, cp)?;
        let k = rope.apply(&norm(k, &self.k_norm)?, cp)?;
        let v = heads(add_bias(self.wv.forward(x)?, &self.bv)?, self.n_kv_heads)?;
        if let Some(cp) = cp {
            let y = self.ring(cp, (&q, &k, &v), mask.window)?;
            return add_bias(self.wo.forward(&y)?, &self.bo);
        }
        if q.dtype() == DType::F32 && self.fused {
            let y = self.fused(&q, &k, &v, mask.window)?;
            return add_bias(self.wo.forward(&y)?, &self.bo);
        }
        let (k, v) = (self.repeat_kv(k)?, self.repeat_kv(v)?);
        let scores = (q.matmul(&k.t()?)? * self.scale)?;
        let scores = scores.broadcast_add(&mask.additive.to_dtype(scores.dtype())?)?;
        // Softmax sums in f32 whatever the activations (candle's would sum bf16 in bf16;
        // frameworks accumulate reduced types in f32).
        let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
            .to_dtype(scores.dtype())?;
        let y = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, self.n_heads * self.head_dim))?;
        add_bias(self.wo.forward(&y)?, &self.bo)
    }

    /// f32 attention through our fused causal kernel ([`attention::causal_attention`]):
    /// `q [b, heads, t, d]`, `k`/`v [b, kv_heads, t, d]` → `[b, t, heads·d]`.
    fn fused(&self, q: &Tensor, k: &Tensor, v: &Tensor, window: Option<usize>) -> Result<Tensor> {
        let (b, _, t, d) = q.dims4()?;
        let shape = attention::AttentionShape {
            batch: b,
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            t,
            head_dim: d,
        };
        let scale = self.scale as f32;
        let y = with_f32(q, |q| {
            with_f32(k, |k| {
                with_f32(v, |v| {
                    attention::causal_attention(q, k, v, shape, scale, window)
                })
            })
        })???;
        Ok(Tensor::from_vec(y, (b, t, self.n_heads * d), &Device::Cpu)?)
    }

    /// Attention of this rank's positions against the whole window, by the context-parallel
    /// ring ([`ring_attention`]), in f32 whatever the activations' dtype.
    fn ring(
        &self,
        cp: &dyn ContextParallel,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        window: Option<usize>,
    ) -> Result<Tensor> {
        let (b, _, t, d) = q.dims4()?;
        let shape = attention::AttentionShape {
            batch: b,
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            t,
            head_dim: d,
        };
        let f32s = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.contiguous()?) };
        let (qf, kf, vf) = (f32s(q)?, f32s(k)?, f32s(v)?);
        let y = with_f32(&qf, |q| {
            with_f32(&kf, |k| {
                with_f32(&vf, |v| {
                    cp.attend((q, k, v), shape, self.scale as f32, window)
                })
            })
        })????;
        Ok(Tensor::from_vec(y, (b, t, self.n_heads * d), q.device())?.to_dtype(q.dtype())?)
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
    /// GELU (tanh approximation, as ggml and Gemma use) instead of SiLU on the gate.
    gelu: bool,
    /// f32 SiLU·up in our one pass ([`Kernels::Own`]).
    fused: bool,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate.forward(x)?;
        let up = self.up.forward(x)?;
        let h = if self.gelu {
            (gate.gelu()? * up)?
        } else if gate.dtype() == DType::F32 && self.fused {
            // One pass with our vectorised exponential (see kernels::math).
            let h = with_f32(&gate, |g| with_f32(&up, |u| math::silu_mul(g, u)))??;
            Tensor::from_vec(h, gate.shape(), &Device::Cpu)?
        } else {
            (gate.silu()? * up)?
        };
        self.down.forward(&h)
    }
}

struct Block {
    attn_norm: RmsNorm,
    attn: Attention,
    /// Gemma: norms of each branch's output before it joins the residual stream.
    post_attn_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    mlp: Mlp,
    post_ffn_norm: Option<RmsNorm>,
    /// Sliding-window layer (its own mask and RoPE table).
    local: bool,
}

impl Block {
    /// Builds block `i` from its tensors, in [`shard::block_specs`] order.
    fn from_raw(
        c: &LlamaConfig,
        i: usize,
        part: &Partition,
        tensors: &[RawTensor<'_>],
        compute: Compute<'_>,
        quant: Option<&Quantize>,
    ) -> Result<Self> {
        let Compute {
            precision,
            device,
            kernels,
        } = compute;
        let specs = shard::block_specs(c, i, part);
        let index = |short: &str| {
            let name = format!("blk.{i}.{short}");
            specs.iter().position(|s| s.name == name)
        };
        let at = |short: &str| index(short).expect("block_specs lists every tensor Block reads");
        let lin = |short: &str| {
            let k = at(short);
            match quant {
                Some(q) => {
                    let site = Site {
                        name: &specs[k].name,
                        n_layers: c.n_layers,
                        output: false,
                    };
                    Linear::quantized(&tensors[k], &site, precision, device, kernels, q)
                }
                None => Linear::from_raw(&tensors[k], &specs[k].name, precision, device, kernels),
            }
        };
        let norm = |short: &str| {
            let k = at(short);
            RmsNorm::from_raw(&tensors[k], &specs[k].name, c, device)
        };
        let vector = |short: &str| -> Result<Option<Tensor>> {
            match index(short) {
                Some(k) => Ok(Some(
                    qtensor(&tensors[k], &specs[k].name, device)?.dequantize(device)?,
                )),
                None => Ok(None),
            }
        };
        let optional_norm = |short: &str| -> Result<Option<RmsNorm>> {
            index(short).map(|_| norm(short)).transpose()
        };
        Ok(Self {
            attn_norm: norm("attn_norm.weight")?,
            attn: Attention {
                wq: lin("attn_q.weight")?,
                wk: lin("attn_k.weight")?,
                wv: lin("attn_v.weight")?,
                wo: lin("attn_output.weight")?,
                bq: vector("attn_q.bias")?,
                bk: vector("attn_k.bias")?,
                bv: vector("attn_v.bias")?,
                bo: if part.tp_rank == 0 {
                    vector("attn_output.bias")?
                } else {
                    None
                },
                q_norm: optional_norm("attn_q_norm.weight")?,
                k_norm: optional_norm("attn_k_norm.weight")?,
                n_heads: part.tp_range(c.n_heads).len(),
                n_kv_heads: part.tp_range(c.n_kv_heads).len(),
                head_dim: c.head_dim,
                scale: c
                    .attention_scale
                    .unwrap_or(1.0 / (c.head_dim as f64).sqrt()),
                fused: kernels == Kernels::Own,
            },
            post_attn_norm: optional_norm("post_attention_norm.weight")?,
            ffn_norm: norm("ffn_norm.weight")?,
            mlp: Mlp {
                gate: lin("ffn_gate.weight")?,
                up: lin("ffn_up.weight")?,
                down: lin("ffn_down.weight")?,
                gelu: c.gemma,
                fused: kernels == Kernels::Own,
            },
            post_ffn_norm: optional_norm("post_ffw_norm.weight")?,
            local: c.is_local(i),
        })
    }

    fn bytes(&self) -> u64 {
        let a = &self.attn;
        let m = &self.mlp;
        [&a.wq, &a.wk, &a.wv, &a.wo, &m.gate, &m.up, &m.down]
            .iter()
            .map(|l| l.bytes())
            .sum::<u64>()
            + 2 * self.attn_norm.weight.elem_count() as u64 * 4
            + [&a.bq, &a.bk, &a.bv, &a.bo]
                .iter()
                .filter_map(|b| b.as_ref())
                .map(|b| b.elem_count() as u64 * 4)
                .sum::<u64>()
            + [
                &a.q_norm,
                &a.k_norm,
                &self.post_attn_norm,
                &self.post_ffn_norm,
            ]
            .iter()
            .filter_map(|n| n.as_ref())
            .map(|n| n.weight.elem_count() as u64 * 4)
            .sum::<u64>()
    }

    /// The residual block; under tensor parallelism each branch's partial output is summed
    /// over the group before it is added to the residual stream.
    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Mask, cc: &Collectives) -> Result<Tensor> {
        let post = |y: Tensor, n: &Option<RmsNorm>| -> Result<Tensor> {
            match n {
                Some(n) => n.forward(&y),
                None => Ok(y),
            }
        };
        // The post-norms act on the whole (all-reduced) branch output.
        let a = cc.reduce(
            self.attn
                .forward(&self.attn_norm.forward(x)?, rope, mask, cc)?,
        )?;
        let h = (x + post(a, &self.post_attn_norm)?)?;
        let m = cc.reduce(self.mlp.forward(&self.ffn_norm.forward(&h)?)?)?;
        Ok((&h + post(m, &self.post_ffn_norm)?)?)
    }
}

/// A block as a rank holds it: ready to run, or as its FSDP piece.
enum Layer {
    Resident(Box<Block>),
    Sharded(LayerShard),
}

/// Rotary position embedding: on adjacent pairs (llama.cpp's "normal" RoPE; GGUF stores
/// Llama's Q/K rows permuted for it) or on the two halves of each head (NeoX, Qwen).
struct Rope {
    cos: Tensor,
    sin: Tensor,
    neox: bool,
}

impl Rope {
    fn new(
        c: &LlamaConfig,
        theta: f64,
        freq_factors: Option<Vec<f32>>,
        device: &Device,
    ) -> Result<Self> {
        let half = c.rope_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let f = 1.0 / theta.powf(2.0 * i as f64 / c.rope_dim as f64);
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
        let angles = Tensor::from_vec(angles, (n, half), device)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
            neox: c.rope_neox,
        })
    }

    /// Rotates `x [b, heads, t, d]` at positions `0..t`, or at this rank's absolute
    /// positions under context parallelism.
    fn apply(&self, x: &Tensor, cp: Option<&dyn ContextParallel>) -> Result<Tensor> {
        let t = x.dim(2)?;
        let (cos, sin) = match cp {
            Some(cp) => {
                let ids: Vec<u32> = cp.positions().iter().map(|&p| p as u32).collect();
                let ids = Tensor::from_vec(ids, t, self.cos.device())?;
                (
                    self.cos.index_select(&ids, 0)?,
                    self.sin.index_select(&ids, 0)?,
                )
            }
            None => (self.cos.narrow(0, 0, t)?, self.sin.narrow(0, 0, t)?),
        };
        let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
        Ok(if self.neox {
            candle_nn::rotary_emb::rope(x, &cos, &sin)?
        } else {
            candle_nn::rotary_emb::rope_i(x, &cos, &sin)?
        })
    }
}

/// A Llama-family model, or the part of one that a rank holds ([`Partition`]), ready to
/// score windows.
pub struct Llama {
    pub config: LlamaConfig,
    pub partition: Partition,
    precision: Precision,
    embedding: Option<Embedding>,
    layers: Vec<Layer>,
    norm: Option<RmsNorm>,
    output: Option<Linear>,
    /// Vocabulary rows of the output layer held here.
    output_vocab: Range<usize>,
    rope: Rope,
    /// The sliding-window layers' table, where their RoPE base differs (Gemma 3).
    rope_local: Option<Rope>,
    quantize: Option<Quantize>,
    /// Where the weights live and the forward pass runs.
    device: Device,
    kernels: Kernels,
}

impl Llama {
    /// Builds the whole model from a parsed GGUF file, loading every weight once.
    pub fn from_gguf(g: &GgufFile, precision: Precision) -> Result<Self> {
        let config = LlamaConfig::from_gguf(g)?;
        let part = Partition::full(config.n_layers);
        Self::from_gguf_part(g, precision, &part)
    }

    /// Builds the part of the model that `part` names: only its tensors are read.
    pub fn from_gguf_part(g: &GgufFile, precision: Precision, part: &Partition) -> Result<Self> {
        Self::load(g, precision, part, None, &Device::Cpu)
    }

    /// [`Self::from_gguf_part`] on `device`, quantizing the weights at load when `quantize`
    /// is given.
    pub fn load(
        g: &GgufFile,
        precision: Precision,
        part: &Partition,
        quantize: Option<Quantize>,
        device: &Device,
    ) -> Result<Self> {
        Self::load_with_kernels(
            g,
            precision,
            part,
            quantize,
            device,
            Kernels::for_device(device),
        )
    }

    /// [`Self::load`] with the forward pass's code chosen ([`Kernels::Own`] is taken as
    /// [`Kernels::Candle`] off the CPU).
    pub fn load_with_kernels(
        g: &GgufFile,
        precision: Precision,
        part: &Partition,
        quantize: Option<Quantize>,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        let kernels = if device.is_cpu() {
            kernels
        } else {
            Kernels::Candle
        };
        let config = LlamaConfig::from_gguf(g)?;
        shard::check_tensor_parallel(g, &config, part.tp, quantize.as_ref())?;
        let (v, d) = (config.vocab_size, config.hidden_size);
        let vocab = part.tp_range(v);
        let embd_spec = TensorSpec {
            rows: vocab.clone(),
            ..TensorSpec::whole("token_embd.weight".into(), &[v, d])
        };
        let need_embd = part.embed || (part.head && config.tied_embeddings);
        let embd = if need_embd {
            let raw = shard::read(g, &embd_spec)?;
            // On the host first: several layouts derive from it, each placed on `device`.
            let q = Arc::new(qtensor(&raw, "token_embd.weight", &Device::Cpu)?);
            release(g, &raw, "token_embd.weight");
            Some(q)
        } else {
            None
        };
        let full_vocab = v;
        let (mut embedding, mut output) = (None, None);
        let quant_embd = quantize.filter(|q| q.covers_embeddings(config.tied_embeddings));
        let quant_out = quantize.filter(|q| q.output);
        // A tied table follows the output layer's type (as llama.cpp's quantizer).
        let embd_site = Site {
            name: "token_embd.weight",
            n_layers: config.n_layers,
            output: config.tied_embeddings,
        };
        if let Some(embd) = &embd {
            // Quantized at load (`--quantize` with embeddings/output): from the f32 values.
            let requantized = |q: &Quantize| -> Result<EmbeddingTable> {
                let w = embd.dequantize(&Device::Cpu)?;
                match quantize::quantize(q, &w, &embd_site).map_err(|e| ModelError::Tensor {
                    name: "token_embd.weight".into(),
                    detail: format!("cannot quantize it to {}: {e}", q.scheme),
                })? {
                    Quantized::Dense(t) => Ok(EmbeddingTable::Dense(
                        t.to_dtype(precision.dtype())?.to_device(device)?,
                    )),
                    // Lookups of a quantized table give f32 rows: dense in bf16/f16.
                    Quantized::Ggml(qt)
                        if matches!(precision, Precision::Bf16 | Precision::F16) =>
                    {
                        Ok(EmbeddingTable::Dense(dense(&qt, precision, device)?))
                    }
                    Quantized::Ggml(qt) => {
                        Ok(EmbeddingTable::Quantized(place_qtensor(qt, device)?))
                    }
                }
            };
            if part.head && config.tied_embeddings {
                output = Some(match (quant_out, precision) {
                    (Some(q), _) => {
                        let raw = shard::read(g, &embd_spec)?;
                        Linear::quantized(&raw, &embd_site, precision, device, kernels, &q)?
                    }
                    (None, Precision::Native) => Linear::from_qtensor(
                        embd.clone(),
                        embd_site.name,
                        precision,
                        device,
                        kernels,
                    )?,
                    (None, p) => Linear::Candle(QMatMul::Tensor(dense(embd, p, device)?)),
                });
            }
            if part.embed {
                embedding = Some(match (quant_embd, precision) {
                    (Some(q), _) => requantized(&q)?,
                    (None, Precision::Native) => {
                        // The tied output layer's decoded rows serve the lookups too.
                        let tied = output
                            .as_ref()
                            .filter(|_| config.tied_embeddings && quant_out.is_none());
                        if let Some(Linear::Own(m)) = tied {
                            EmbeddingTable::Own(m.clone())
                        } else if let Some(Linear::Candle(QMatMul::QTensor(q))) =
                            tied.filter(|_| kernels == Kernels::Candle)
                        {
                            // The output layer's copy on the GPU serves the lookups too.
                            EmbeddingTable::Quantized(q.clone())
                        } else if let Some(Linear::Candle(QMatMul::Tensor(t))) =
                            tied.filter(|_| embd.dtype() == GgmlDType::F32)
                        {
                            // An F32 table: the output layer's dense copy serves the lookups.
                            EmbeddingTable::Dense(t.clone())
                        } else if let Some(m) = own_table(embd, kernels)? {
                            // F16/BF16 stay 16-bit: rows decoded as they are looked up.
                            EmbeddingTable::Own(m)
                        } else if embd.dtype().block_size() == 1 {
                            EmbeddingTable::Dense(dense(embd, Precision::F32, device)?)
                        } else {
                            EmbeddingTable::Quantized(place_qtensor(embd.clone(), device)?)
                        }
                    }
                    (None, p) => {
                        // Shares the output layer's dense copy when tied and both are here.
                        match &output {
                            Some(Linear::Candle(QMatMul::Tensor(t)))
                                if config.tied_embeddings && quant_out.is_none() =>
                            {
                                EmbeddingTable::Dense(t.clone())
                            }
                            _ => EmbeddingTable::Dense(dense(embd, p, device)?),
                        }
                    }
                });
            }
        }
        drop(embd);
        if part.head && !config.tied_embeddings {
            let spec = TensorSpec {
                rows: vocab.clone(),
                ..TensorSpec::whole("output.weight".into(), &[v, d])
            };
            let raw = shard::read(g, &spec)?;
            output = Some(match quant_out {
                Some(q) => {
                    let site = Site {
                        name: "output.weight",
                        n_layers: config.n_layers,
                        output: true,
                    };
                    Linear::quantized(&raw, &site, precision, device, kernels, &q)?
                }
                None => Linear::from_raw(&raw, "output.weight", precision, device, kernels)?,
            });
            release(g, &raw, "output.weight");
        }
        let layers = part
            .layers
            .clone()
            .map(|i| {
                let specs = shard::block_specs(&config, i, part);
                let raws = specs
                    .iter()
                    .map(|s| shard::read(g, s))
                    .collect::<Result<Vec<_>>>()?;
                let layer = if part.fsdp > 1 {
                    Layer::Sharded(LayerShard::new(&raws, part.fsdp_rank, part.fsdp))
                } else {
                    Layer::Resident(Box::new(Block::from_raw(
                        &config,
                        i,
                        part,
                        &raws,
                        Compute {
                            precision,
                            device,
                            kernels,
                        },
                        quantize.as_ref(),
                    )?))
                };
                for (s, raw) in specs.iter().zip(&raws) {
                    release(g, raw, &s.name);
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>>>()?;
        let freq_factors = match g.tensors.get("rope_freqs.weight") {
            Some(_) => Some(
                g.qtensor("rope_freqs.weight", &[config.rope_dim / 2], &Device::Cpu)?
                    .dequantize(&Device::Cpu)?
                    .to_vec1::<f32>()?,
            ),
            None => None,
        };
        let norm = if part.head {
            Some(RmsNorm::load(g, "output_norm.weight", &config, device)?)
        } else {
            None
        };
        Ok(Self {
            rope_local: match config.local_layers.is_empty() {
                false => Some(Rope::new(&config, config.rope_theta_local, None, device)?),
                true => None,
            },
            rope: Rope::new(&config, config.rope_theta, freq_factors, device)?,
            embedding: embedding.map(|table| Embedding {
                table,
                vocab: vocab.clone(),
                full_vocab,
            }),
            output_vocab: if part.head { vocab } else { 0..0 },
            config,
            partition: part.clone(),
            precision,
            layers,
            norm,
            output,
            quantize,
            device: device.clone(),
            kernels,
        })
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Where the weights live and the forward pass runs.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of weights this rank holds (FSDP pieces counted as stored).
    pub fn weights_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| match l {
                Layer::Resident(b) => b.bytes(),
                Layer::Sharded(s) => s.piece.len() as u64,
            })
            .sum();
        let embedding = self.embedding.as_ref().map_or(0, |e| e.bytes());
        let output = self.output.as_ref().map_or(0, |o| o.bytes());
        // A tied embedding used as the output layer shares its storage (the quantized table
        // in native precision, the dense tensor otherwise): counted once.
        // A tied table serving both lookups and the output layer is one copy: counted once.
        let same = |a: *const (), b: *const ()| std::ptr::eq(a, b);
        let shared = match (
            self.embedding.as_ref().map(|e| &e.table),
            self.output.as_ref(),
        ) {
            (Some(EmbeddingTable::Own(a)), Some(Linear::Own(b))) => {
                same(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
            }
            (Some(EmbeddingTable::Quantized(a)), Some(Linear::Candle(QMatMul::QTensor(b)))) => {
                Arc::ptr_eq(a, b)
            }
            (Some(EmbeddingTable::Dense(a)), Some(Linear::Candle(QMatMul::Tensor(b)))) => {
                a.id() == b.id()
            }
            _ => false,
        };
        let norm = self
            .norm
            .as_ref()
            .map_or(0, |n| n.weight.elem_count() as u64 * 4);
        layers + embedding + norm + if shared { 0 } else { output }
    }

    /// The vocabulary rows of the output layer this rank computes.
    pub fn output_vocab(&self) -> Range<usize> {
        self.output_vocab.clone()
    }

    /// Embeddings `[batch, seq, hidden]` of token ids `[batch, seq]` (first stage only; under
    /// tensor parallelism a partial sum to be all-reduced).
    pub fn embed(&self, ids: &Tensor, cc: &Collectives) -> Result<Tensor> {
        let e = self
            .embedding
            .as_ref()
            .ok_or_else(|| self.not_held("the token embedding"))?;
        let x = cc.reduce(e.forward(ids)?)?;
        if self.config.gemma {
            // ggml scales by sqrtf(n_embd), an f32.
            let scale = (self.config.hidden_size as f32).sqrt();
            return Ok((x * f64::from(scale))?);
        }
        Ok(x)
    }

    /// Runs this rank's blocks over `x` (`None`: an idle FSDP step, which only takes part in
    /// the gathers so that the other ranks of the shard group can run theirs).
    pub fn run_layers(&self, x: Option<Tensor>, cc: &Collectives) -> Result<Option<Tensor>> {
        // Global layers see every earlier position; local ones the sliding window.
        let masks = match &x {
            Some(x) => {
                // Under context parallelism the ring masks by absolute position; only the
                // sliding window's width is read.
                let cp = cc.context_parallel.is_some();
                let t = if cp { 1 } else { x.dim(1)? };
                let global = causal_mask(t, None, x.device())?;
                let local = match self.config.sliding_window {
                    Some(w) if w < t || cp => causal_mask(t, Some(w), x.device())?,
                    _ => global.clone(),
                };
                Some((global, local))
            }
            None => None,
        };
        let mut x = x;
        for (i, layer) in self.partition.layers.clone().zip(&self.layers) {
            let gathered;
            let block = match layer {
                Layer::Resident(b) => b,
                Layer::Sharded(s) => {
                    let gather = cc.fsdp_all_gather.ok_or_else(|| {
                        self.not_held("an FSDP-sharded layer without its shard group")
                    })?;
                    let tensors = s.unpack(gather(&s.piece)?)?;
                    if x.is_none() {
                        continue;
                    }
                    gathered = Block::from_raw(
                        &self.config,
                        i,
                        &self.partition,
                        &tensors,
                        Compute {
                            precision: self.precision,
                            device: &self.device,
                            kernels: self.kernels,
                        },
                        self.quantize.as_ref(),
                    )?;
                    &gathered
                }
            };
            if let (Some(h), Some((global, local))) = (&x, &masks) {
                let (rope, mask) = if block.local {
                    (self.rope_local.as_ref().unwrap_or(&self.rope), local)
                } else {
                    (&self.rope, global)
                };
                x = Some(block.forward(h, rope, mask, cc)?);
            }
        }
        Ok(x)
    }

    /// The final norm (last stage only).
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm
            .as_ref()
            .ok_or_else(|| self.not_held("the final norm"))?
            .forward(x)
    }

    fn not_held(&self, what: &str) -> ModelError {
        ModelError::Run(format!(
            "{what} is not held by this rank (partition {:?})",
            self.partition
        ))
    }

    /// Final (normalised) hidden states `[batch, seq, hidden]` for token ids `[batch, seq]`
    /// (the whole model on this rank).
    pub fn hidden_states(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed(ids, &Collectives::NONE)?;
        let x = self
            .run_layers(Some(x), &Collectives::NONE)?
            .expect("an active step returns hidden states");
        self.final_norm(&x)
    }

    /// Logits `[.., vocab]` (f32) for hidden states `[.., hidden]`: under tensor parallelism
    /// only this rank's [`Llama::output_vocab`] columns.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let out = self
            .output
            .as_ref()
            .ok_or_else(|| self.not_held("the output layer"))?;
        let y = out.forward(&hidden.contiguous()?)?;
        Ok(y.to_dtype(DType::F32)?)
    }

    /// Logits for every position: `[batch, seq, vocab]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(&self.hidden_states(ids)?)
    }
}

/// An untied 16-bit (F16/BF16) embedding table held by our kernel in native precision, so it
/// stays 16-bit; `None` for other types or candle's kernels.
fn own_table(embd: &QTensor, kernels: Kernels) -> Result<Option<Arc<dyn OwnMatrix>>> {
    if kernels != Kernels::Own || !matches!(embd.dtype(), GgmlDType::F16 | GgmlDType::BF16) {
        return Ok(None);
    }
    let own = Linear::own(
        embd.dtype(),
        &embd.data()?,
        embd.shape().dims(),
        "token_embd.weight",
    )?;
    Ok(own.and_then(|l| match l {
        Linear::Own(m) => Some(m),
        Linear::Candle(_) => None,
    }))
}

/// The f32 values of `q` in `precision`'s dtype, on `device`.
fn dense(q: &QTensor, precision: Precision, device: &Device) -> Result<Tensor> {
    Ok(q.dequantize(&Device::Cpu)?
        .to_dtype(precision.dtype())?
        .to_device(device)?)
}

/// Drops a tensor's mapped pages once its bytes were copied (see [`GgufFile::release`]).
fn release(g: &GgufFile, _copied: &RawTensor<'_>, name: &str) {
    if let Some(info) = g.tensors.get(name) {
        g.release(info);
    }
}

/// Which earlier positions a position sees: `j <= i`, and within the last `window` positions
/// when there is one. The fused f32 kernel reads the window; other dtypes add the `[t, t]`
/// mask (0 where `i` sees `j`, -inf elsewhere) to their scores.
#[derive(Clone)]
struct Mask {
    additive: Tensor,
    window: Option<usize>,
}

fn causal_mask(t: usize, window: Option<usize>, device: &Device) -> Result<Mask> {
    let w = window.unwrap_or(usize::MAX);
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..t).map(move |j| {
                if j > i || i - j >= w {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Ok(Mask {
        additive: Tensor::from_vec(mask, (t, t), device)?,
        window,
    })
}
