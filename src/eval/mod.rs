//! Evaluation: windows → model → per-token NLL ([`nll`]) → exact accumulation
//! ([`accumulator`]) → statistics ([`stats`]).
//!
//! [`score_batch`] runs a batch of windows through a model and returns one exact record per
//! window. Nothing in a window's record depends on which other windows shared its batch: each
//! window has its own causal mask, and all matmuls and reductions are per row with a fixed
//! summation order.

pub mod accumulator;
pub mod base_file;
pub mod kld;
pub mod ledger;
pub mod nll;
pub mod record;
pub mod runs;
pub mod stats;

use candle_core::{Device, Tensor};
use rayon::prelude::*;

pub use accumulator::NllAccumulator;
pub use record::Record;

use crate::data::Window;
use crate::model::{Llama, ModelError};

/// How many rows of logits exist at once (defined beside the planner that budgets them).
pub use crate::model::memory::{DEVICE_LOGIT_ROWS, LOGIT_ROWS};

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

/// One forward pass over windows of equal input length (the whole model on this rank).
pub fn score_batch(model: &Llama, batch: &[Window]) -> Result<Vec<WindowResult>, ModelError> {
    let hidden = model.hidden_states(&batch_ids(batch, model.device())?)?;
    let (rows, targets) = scored_rows(&hidden, batch)?;
    let nlls = nlls(model, &rows, &targets)?;
    window_results(batch, &nlls)
}

/// Token ids `[batch, len]` of windows of equal input length, on `device`.
pub fn batch_ids(batch: &[Window], device: &Device) -> Result<Tensor, ModelError> {
    let len = batch[0].input.len();
    let ids: Vec<u32> = batch.iter().flat_map(|w| w.input.iter().copied()).collect();
    Ok(Tensor::from_vec(ids, (batch.len(), len), device)?)
}

/// The hidden states of scored positions only (they alone reach the vocabulary-wide output
/// layer), and their targets, window after window.
pub fn scored_rows(hidden: &Tensor, batch: &[Window]) -> Result<(Tensor, Vec<u32>), ModelError> {
    let mut rows = Vec::with_capacity(batch.len());
    let mut targets = Vec::new();
    for (b, w) in batch.iter().enumerate() {
        rows.push(hidden.get(b)?.narrow(0, w.first_scored, w.targets.len())?);
        targets.extend_from_slice(&w.targets);
    }
    Ok((Tensor::cat(&rows, 0)?, targets))
}

fn check_targets(targets: &[u32], vocab: usize) -> Result<(), ModelError> {
    match targets.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(ModelError::Run(format!(
            "token id {t} is outside the model's vocabulary ({vocab})"
        ))),
        None => Ok(()),
    }
}

/// Per-token NLL of `rows` against `targets`, [`LOGIT_ROWS`] rows of logits at a time. On a
/// GPU the log-softmax runs there ([`nll::nll_rows_on_device`]) and only the NLLs come back.
pub fn nlls(model: &Llama, rows: &Tensor, targets: &[u32]) -> Result<Vec<f64>, ModelError> {
    let vocab = model.config.vocab_size;
    check_targets(targets, vocab)?;
    let on_host = rows.device().is_cpu();
    let block = if on_host {
        LOGIT_ROWS
    } else {
        DEVICE_LOGIT_ROWS
    };
    let mut nlls = Vec::with_capacity(targets.len());
    let mut r = 0;
    while r < targets.len() {
        let n = block.min(targets.len() - r);
        let logits = model.logits(&rows.narrow(0, r, n)?)?;
        let targets = &targets[r..r + n];
        if on_host {
            nlls.extend(with_host_f32(&logits, |l| {
                nll::nll_rows(l, vocab, targets)
            })?);
        } else {
            nlls.extend(nll::nll_rows_on_device(
                &logits.reshape((n, vocab))?,
                targets,
            )?);
        }
        r += n;
    }
    Ok(nlls)
}

/// Runs `f` on the f32 values of a CPU tensor, borrowed when it is contiguous f32 (the logits
/// block: 64 MiB at Gemma's 262k vocabulary, whose copy cost a memcpy and a fresh mapping's
/// page faults per block), else on a copy.
fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    use candle_core::{CpuStorage, Storage};
    let (storage, layout) = t.storage_and_layout();
    if let (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    {
        return Ok(f(&v[start..end]));
    }
    drop(storage);
    Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
}

/// This rank's partial log-softmax rows over its share of the vocabulary (tensor parallel).
pub fn partial_rows(
    model: &Llama,
    rows: &Tensor,
    targets: &[u32],
) -> Result<Vec<nll::PartialRow>, ModelError> {
    check_targets(targets, model.config.vocab_size)?;
    let cols = model.output_vocab();
    let mut out = Vec::with_capacity(targets.len());
    let mut r = 0;
    while r < targets.len() {
        let n = LOGIT_ROWS.min(targets.len() - r);
        let logits = model.logits(&rows.narrow(0, r, n)?)?;
        let logits = logits.flatten_all()?.to_vec1::<f32>()?;
        out.par_extend(
            logits
                .par_chunks(cols.len())
                .zip(targets[r..r + n].par_iter())
                .map(|(row, &t)| nll::partial_row(row, cols.start, t)),
        );
        r += n;
    }
    Ok(out)
}

/// One exact record per window from its tokens' NLLs (in window order). A NaN or infinite
/// NLL (a NaN weight, an overflow) is an error naming the window: summed in fixed point it
/// would silently count as 0.
pub fn window_results(batch: &[Window], nlls: &[f64]) -> Result<Vec<WindowResult>, ModelError> {
    let mut out = Vec::with_capacity(batch.len());
    let mut k = 0;
    for w in batch {
        let mut acc = NllAccumulator::default();
        for (token, &x) in nlls[k..k + w.targets.len()].iter().enumerate() {
            if !x.is_finite() {
                return Err(ModelError::NonFinite {
                    window: w.index,
                    start: w.start,
                    token,
                    value: x,
                });
            }
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
