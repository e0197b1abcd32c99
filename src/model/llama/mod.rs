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

mod layers;
mod linear;
mod load;

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};

use crate::model::quantize::Quantize;
use crate::model::shard::Partition;
use crate::model::{ModelError, Precision};

pub(super) type Result<T> = std::result::Result<T, ModelError>;

pub use crate::model::config::LlamaConfig;
use layers::*;
pub use layers::{AllGather, AllReduce, Collectives};
use linear::*;
pub use linear::{with_f32, Kernels};

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
        if self.config.arch.is_gemma() {
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
