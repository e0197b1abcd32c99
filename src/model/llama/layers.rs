//! The blocks of the forward pass: embeddings, RMSNorm, attention (RoPE, grouped-query,
//! sliding windows, the causal mask), the MLP, and a transformer block made of them.

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::model::block_tensors::BlockTensors;
use crate::model::gguf::GgufFile;
use crate::model::kernels::{attention, math, OwnMatrix};
use crate::model::quantize::{Quantize, Site};
use crate::model::ring_attention::ContextParallel;
use crate::model::shard::{self, LayerShard, Partition, RawTensor, TensorSpec};

use super::*;

pub(super) struct RmsNorm {
    pub(super) weight: Tensor,
    pub(super) eps: f32,
}

impl RmsNorm {
    pub(super) fn from_raw(
        raw: &RawTensor<'_>,
        name: &str,
        c: &LlamaConfig,
        device: &Device,
    ) -> Result<Self> {
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

    pub(super) fn load(g: &GgufFile, name: &str, c: &LlamaConfig, device: &Device) -> Result<Self> {
        let raw = shard::read(g, &TensorSpec::whole(name.to_string(), &[c.hidden_size]))?;
        Self::from_raw(&raw, name, c, device)
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
pub(super) struct Embedding {
    pub(super) table: EmbeddingTable,
    pub(super) vocab: Range<usize>,
    pub(super) full_vocab: usize,
}

pub(super) enum EmbeddingTable {
    Quantized(Arc<QTensor>),
    /// The tied output layer's copy held for our kernels, decoded a row at a time (native
    /// precision).
    Own(Arc<dyn OwnMatrix>),
    Dense(Tensor),
}

impl Embedding {
    pub(super) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
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

    pub(super) fn bytes(&self) -> u64 {
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

    pub(super) fn reduce(&self, x: Tensor) -> Result<Tensor> {
        match self.tp_all_reduce {
            Some(f) => f(x),
            None => Ok(x),
        }
    }
}

pub(super) struct Attention {
    pub(super) wq: Linear,
    pub(super) wk: Linear,
    pub(super) wv: Linear,
    pub(super) wo: Linear,
    /// Q/K/V biases (Qwen2), this rank's rows.
    pub(super) bq: Option<Tensor>,
    pub(super) bk: Option<Tensor>,
    pub(super) bv: Option<Tensor>,
    /// Output bias: added by one tensor-parallel rank only (the others' partial sums must
    /// not carry it again).
    pub(super) bo: Option<Tensor>,
    /// Per-head RMSNorm of Q and K (Qwen3).
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    /// Heads held by this rank (all of them without tensor parallelism).
    pub(super) n_heads: usize,
    pub(super) n_kv_heads: usize,
    pub(super) head_dim: usize,
    /// Multiplies Q·K (1/√head_dim unless the model says otherwise).
    pub(super) scale: f64,
    /// f32 attention through our fused kernel ([`Kernels::Own`]).
    pub(super) fused: bool,
}

/// `y + bias` broadcast over the rows, in `y`'s dtype.
pub(super) fn add_bias(y: Tensor, bias: &Option<Tensor>) -> Result<Tensor> {
    Ok(match bias {
        Some(b) => y.broadcast_add(&b.to_dtype(y.dtype())?)?,
        None => y,
    })
}

impl Attention {
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        mask: &Mask,
        cc: &Collectives,
    ) -> Result<Tensor> {
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
        let Ok([q, k, v]) =
            <[Tensor; 3]>::try_from(Linear::forward_shared(&[&self.wq, &self.wk, &self.wv], x)?)
        else {
            unreachable!("three projections give three products")
        };
        let q = heads(add_bias(q, &self.bq)?, self.n_heads)?;
        let k = heads(add_bias(k, &self.bk)?, self.n_kv_heads)?;
        let cp = cc.context_parallel;
        let q = rope.apply(&norm(q, &self.q_norm)?, cp)?;
        let k = rope.apply(&norm(k, &self.k_norm)?, cp)?;
        let v = heads(add_bias(v, &self.bv)?, self.n_kv_heads)?;
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
    pub(super) fn fused(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
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
    /// ring ([`crate::model::ring_attention`]), in f32 whatever the activations' dtype.
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
    pub(super) fn repeat_kv(&self, x: Tensor) -> Result<Tensor> {
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

pub(super) struct Mlp {
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
    /// GELU (tanh approximation, as ggml and Gemma use) instead of SiLU on the gate.
    pub(super) gelu: bool,
    /// f32 SiLU·up in our one pass ([`Kernels::Own`]).
    pub(super) fused: bool,
}

impl Mlp {
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.gelu && self.fused {
            if let Some(h) = self.own_silu_mul(x)? {
                return self.down.forward(&h);
            }
        }
        let Ok([gate, up]) =
            <[Tensor; 2]>::try_from(Linear::forward_shared(&[&self.gate, &self.up], x)?)
        else {
            unreachable!("two projections give two products")
        };
        let on_host_f32 = gate.dtype() == DType::F32
            && up.dtype() == DType::F32
            && gate.device().is_cpu()
            && gate.shape() == up.shape();
        let h = if self.gelu && on_host_f32 {
            // candle's gelu and mul in one pass on our pool, the same bits (see math).
            let h = with_f32(&gate, |g| with_f32(&up, |u| math::gelu_mul(g, u)))??;
            Tensor::from_vec(h, gate.shape(), &Device::Cpu)?
        } else if self.gelu {
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

    /// `silu(gate)·up` when both are our kernels: the product written over the gate's
    /// values, so that the MLP's peak holds two `[tokens, ffn]` buffers rather than three
    /// (16 MB fewer for a 512-token window of a 1B model, 29 MB of an 8B). The same
    /// operations as [`math::silu_mul`], so the same bits.
    fn own_silu_mul(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let Some(products) = Linear::own_forward_shared(&[&self.gate, &self.up], x)? else {
            return Ok(None);
        };
        let Ok([(mut gate, dims), (up, up_dims)]) = <[_; 2]>::try_from(products) else {
            unreachable!("two projections give two products")
        };
        if up_dims != dims {
            return Err(ModelError::Tensor {
                name: "ffn_up".to_string(),
                detail: format!("gives {up_dims:?} where ffn_gate gives {dims:?}"),
            });
        }
        math::silu_mul_in_place(&mut gate, &up);
        drop(up);
        Ok(Some(Tensor::from_vec(gate, dims, &Device::Cpu)?))
    }
}

pub(super) struct Block {
    pub(super) attn_norm: RmsNorm,
    pub(super) attn: Attention,
    /// Gemma: norms of each branch's output before it joins the residual stream.
    pub(super) post_attn_norm: Option<RmsNorm>,
    pub(super) ffn_norm: RmsNorm,
    pub(super) mlp: Mlp,
    pub(super) post_ffn_norm: Option<RmsNorm>,
    /// Sliding-window layer (its own mask and RoPE table).
    pub(super) local: bool,
}

impl Block {
    /// Builds block `i` from its tensors (as [`shard::block_specs`] describes them).
    pub(super) fn from_raw(
        c: &LlamaConfig,
        i: usize,
        part: &Partition,
        tensors: &BlockTensors<RawTensor<'_>>,
        compute: Compute<'_>,
        quant: Option<&Quantize>,
    ) -> Result<Self> {
        let Compute {
            precision,
            device,
            kernels,
        } = compute;
        let lin = |t: &RawTensor<'_>| match quant {
            Some(q) => {
                let site = Site {
                    name: &t.name,
                    n_layers: c.n_layers,
                    output: false,
                };
                Linear::quantized(t, &site, precision, device, kernels, q)
            }
            None => Linear::from_raw(t, &t.name, precision, device, kernels),
        };
        let norm = |t: &RawTensor<'_>| RmsNorm::from_raw(t, &t.name, c, device);
        let optional_norm = |t: &Option<RawTensor<'_>>| t.as_ref().map(norm).transpose();
        let vector = |t: &Option<RawTensor<'_>>| -> Result<Option<Tensor>> {
            t.as_ref()
                .map(|t| -> Result<Tensor> { Ok(qtensor(t, &t.name, device)?.dequantize(device)?) })
                .transpose()
        };
        Ok(Self {
            attn_norm: norm(&tensors.attn_norm)?,
            attn: Attention {
                wq: lin(&tensors.wq)?,
                wk: lin(&tensors.wk)?,
                wv: lin(&tensors.wv)?,
                wo: lin(&tensors.wo)?,
                bq: vector(&tensors.bq)?,
                bk: vector(&tensors.bk)?,
                bv: vector(&tensors.bv)?,
                bo: if part.tp_rank == 0 {
                    vector(&tensors.bo)?
                } else {
                    None
                },
                q_norm: optional_norm(&tensors.q_norm)?,
                k_norm: optional_norm(&tensors.k_norm)?,
                n_heads: part.tp_range(c.n_heads).len(),
                n_kv_heads: part.tp_range(c.n_kv_heads).len(),
                head_dim: c.head_dim,
                scale: c
                    .attention_scale
                    .unwrap_or(1.0 / (c.head_dim as f64).sqrt()),
                fused: kernels == Kernels::Own,
            },
            post_attn_norm: optional_norm(&tensors.post_attn_norm)?,
            ffn_norm: norm(&tensors.ffn_norm)?,
            mlp: Mlp {
                gate: lin(&tensors.w_gate)?,
                up: lin(&tensors.w_up)?,
                down: lin(&tensors.w_down)?,
                gelu: c.arch.is_gemma(),
                fused: kernels == Kernels::Own,
            },
            post_ffn_norm: optional_norm(&tensors.post_ffn_norm)?,
            local: c.is_local(i),
        })
    }

    pub(super) fn bytes(&self) -> u64 {
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
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        mask: &Mask,
        cc: &Collectives,
    ) -> Result<Tensor> {
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
        let h = residual(x, &post(a, &self.post_attn_norm)?)?;
        let m = cc.reduce(self.mlp.forward(&self.ffn_norm.forward(&h)?)?)?;
        residual(&h, &post(m, &self.post_ffn_norm)?)
    }
}

/// `x + y` on the residual stream: our elementwise add for f32 on the host (the same bits
/// as candle's, without its pool's spinning barrier, see [`math::add`]), candle's elsewhere.
fn residual(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu()
        && y.device().is_cpu()
        && x.dtype() == DType::F32
        && y.dtype() == DType::F32
        && x.shape() == y.shape()
    {
        let sum = with_f32(x, |a| with_f32(y, |b| math::add(a, b)))??;
        return Ok(Tensor::from_vec(sum, x.shape(), &Device::Cpu)?);
    }
    Ok((x + y)?)
}

/// A block as a rank holds it: ready to run, or as its FSDP piece.
pub(super) enum Layer {
    Resident(Box<Block>),
    Sharded(LayerShard),
}

/// Rotary position embedding: on adjacent pairs (llama.cpp's "normal" RoPE; GGUF stores
/// Llama's Q/K rows permuted for it) or on the two halves of each head (NeoX, Qwen).
///
/// The cos/sin table covers the positions used so far, grown on demand up to the model's
/// context length: a 512-token evaluation of a 128k-context model computes 512 rows, not
/// 131,072. Each entry depends only on its position and frequency, so a grown table holds the
/// same bits as one built whole.
pub(super) struct Rope {
    inv_freq: Vec<f32>,
    max_positions: usize,
    device: Device,
    table: std::sync::RwLock<Option<RopeTable>>,
    pub(super) neox: bool,
}

#[derive(Clone)]
struct RopeTable {
    /// `[rows, rope_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    rows: usize,
}

impl Rope {
    pub(super) fn new(
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
        Ok(Self {
            inv_freq,
            max_positions: c.context_length,
            device: device.clone(),
            table: std::sync::RwLock::new(None),
            neox: c.rope_neox,
        })
    }

    /// A table of at least `positions` rows (or all the model's, when it has fewer).
    fn table(&self, positions: usize) -> Result<RopeTable> {
        let have = |t: &Option<RopeTable>| {
            t.as_ref()
                .filter(|t| t.rows >= positions.min(self.max_positions))
                .cloned()
        };
        // A poisoned lock only means another thread panicked while growing the table; the
        // table itself is either the old or the new one, both valid.
        if let Some(t) = have(&self.table.read().unwrap_or_else(|e| e.into_inner())) {
            return Ok(t);
        }
        let mut guard = self.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = have(&guard) {
            return Ok(t);
        }
        let rows = positions
            .max(256)
            .next_power_of_two()
            .min(self.max_positions);
        let half = self.inv_freq.len();
        let mut angles = Vec::with_capacity(rows * half);
        for p in 0..rows {
            for &f in &self.inv_freq {
                angles.push(p as f32 * f);
            }
        }
        let angles = Tensor::from_vec(angles, (rows, half), &self.device)?;
        let t = RopeTable {
            cos: angles.cos()?,
            sin: angles.sin()?,
            rows,
        };
        *guard = Some(t.clone());
        Ok(t)
    }

    /// Rotates `x [b, heads, t, d]` at positions `0..t`, or at this rank's absolute
    /// positions under context parallelism.
    pub(super) fn apply(&self, x: &Tensor, cp: Option<&dyn ContextParallel>) -> Result<Tensor> {
        let t = x.dim(2)?;
        let (cos, sin) = match cp {
            Some(cp) => {
                let positions = cp.positions();
                let table = self.table(positions.iter().max().map_or(0, |&p| p + 1))?;
                let ids: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
                let ids = Tensor::from_vec(ids, t, &self.device)?;
                (
                    table.cos.index_select(&ids, 0)?,
                    table.sin.index_select(&ids, 0)?,
                )
            }
            None => {
                let table = self.table(t)?;
                (table.cos.narrow(0, 0, t)?, table.sin.narrow(0, 0, t)?)
            }
        };
        let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
        Ok(if self.neox {
            candle_nn::rotary_emb::rope(x, &cos, &sin)?
        } else {
            candle_nn::rotary_emb::rope_i(x, &cos, &sin)?
        })
    }
}

/// Which earlier positions a position sees: `j <= i`, and within the last `window` positions
/// when there is one. The fused f32 kernel reads the window; other dtypes add the `[t, t]`
/// mask (0 where `i` sees `j`, -inf elsewhere) to their scores.
#[derive(Clone)]
pub(super) struct Mask {
    pub(super) additive: Tensor,
    pub(super) window: Option<usize>,
}

pub(super) fn causal_mask(t: usize, window: Option<usize>, device: &Device) -> Result<Mask> {
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
