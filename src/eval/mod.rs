//! Evaluation: windows → model → per-token NLL ([`nll`]) → exact accumulation
//! ([`accumulator`]) → statistics ([`stats`]).
//!
//! [`score_batch`] runs a batch of windows through a model and returns one exact record per
//! window. Nothing in a window's record depends on which other windows shared its batch: each
//! window has its own causal mask, and all matmuls and reductions are per row with a fixed
//! summation order.

pub mod accumulator;
pub mod nll;
pub mod stats;

use candle_core::{Device, Tensor};

pub use accumulator::NllAccumulator;

use crate::data::Window;
use crate::model::{Llama, ModelError};

/// Rows of hidden states projected onto the vocabulary at once: bounds the logits buffer
/// (256 × 49,152 × 4 bytes ≈ 50 MB for SmolLM2) whatever the batch size.
pub const LOGIT_ROWS: usize = 256;

/// The exact outcome of one window.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowResult {
    pub index: usize,
    pub group: usize,
    /// Tokens fed to the model.
    pub input_tokens: usize,
    pub acc: NllAccumulator,
    /// The rank that scored it.
    pub rank: usize,
    /// Seconds from the start of that rank's scoring to the end of this window's batch.
    pub finished_s: f64,
}

/// One forward pass over windows of equal input length.
pub fn score_batch(model: &Llama, batch: &[Window]) -> Result<Vec<WindowResult>, ModelError> {
    let len = batch[0].input.len();
    let ids: Vec<u32> = batch.iter().flat_map(|w| w.input.iter().copied()).collect();
    let ids = Tensor::from_vec(ids, (batch.len(), len), &Device::Cpu)?;
    let hidden = model.hidden_states(&ids)?;
    // Only scored positions reach the (vocabulary-wide) output layer.
    let mut rows = Vec::with_capacity(batch.len());
    let mut targets = Vec::new();
    for (b, w) in batch.iter().enumerate() {
        rows.push(hidden.get(b)?.narrow(0, w.first_scored, w.targets.len())?);
        targets.extend_from_slice(&w.targets);
    }
    let rows = Tensor::cat(&rows, 0)?;
    let vocab = model.config.vocab_size;
    let mut nlls = Vec::with_capacity(targets.len());
    let mut r = 0;
    while r < targets.len() {
        let n = LOGIT_ROWS.min(targets.len() - r);
        let logits = model.logits(&rows.narrow(0, r, n)?)?;
        let logits = logits.flatten_all()?.to_vec1::<f32>()?;
        for &t in &targets[r..r + n] {
            if t as usize >= vocab {
                return Err(ModelError::Invalid {
                    path: Default::default(),
                    detail: format!("token id {t} is outside the model's vocabulary ({vocab})"),
                });
            }
        }
        nlls.extend(nll::nll_rows(&logits, vocab, &targets[r..r + n]));
        r += n;
    }
    let mut out = Vec::with_capacity(batch.len());
    let mut k = 0;
    for w in batch {
        let mut acc = NllAccumulator::default();
        for &x in &nlls[k..k + w.targets.len()] {
            acc.add(x);
        }
        k += w.targets.len();
        out.push(WindowResult {
            index: w.index,
            group: w.group,
            input_tokens: w.input.len(),
            acc,
            rank: 0,
            finished_s: 0.0,
        });
    }
    Ok(out)
}
