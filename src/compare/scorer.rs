//! [`CompareScorer`]: `ppl compare` as a [`Scorer`] of the data-parallel protocol. A unit of
//! windows goes through both models (or, from a base file, the base's stored rows through its
//! output layer); per scored token the two full distributions are compared in f64
//! ([`kld::compare_rows`]), [`LOGIT_ROWS`] rows of logits at a time.

use candle_core::{DType, Device, Tensor};

use super::load::LoadedBase;
use super::record::WindowPart;
use crate::data::Window;
use crate::eval::kld::{self, TokenComparison};
use crate::eval::{self, LOGIT_ROWS};
use crate::model::{Llama, ModelError};
use crate::parallel::data_parallel::{RunError, Scorer};

/// Both sides of a comparison on one rank.
pub(super) struct CompareScorer<'a> {
    pub(super) model: &'a Llama,
    pub(super) base: &'a LoadedBase,
    pub(super) windows: &'a [Window],
    /// Keep the base's rows in each record (`--save-base`).
    pub(super) save: bool,
}

impl Scorer for CompareScorer<'_> {
    type Output = WindowPart;

    fn score(&mut self, unit: &[usize]) -> Result<Vec<WindowPart>, RunError> {
        Ok(self.compare_unit(unit)?)
    }
}

impl CompareScorer<'_> {
    fn compare_unit(&self, unit: &[usize]) -> Result<Vec<WindowPart>, ModelError> {
        let batch: Vec<Window> = unit.iter().map(|&i| self.windows[i].clone()).collect();
        let ids = eval::batch_ids(&batch, self.model.device())?;
        let (rows_m, targets) = eval::scored_rows(&self.model.hidden_states(&ids)?, &batch)?;
        let rows_b = self.base_rows(unit, &batch, &ids, targets.len())?;
        let tokens = self.compare_tokens(&rows_m, &rows_b, &targets)?;
        let hidden = self.base.llama.config.hidden_size;
        let stored = if self.save {
            rows_b.flatten_all()?.to_vec1::<f32>()?
        } else {
            Vec::new()
        };
        let mut parts = Vec::with_capacity(unit.len());
        let mut k = 0;
        for (w, &index) in batch.iter().zip(unit) {
            let len = w.targets.len();
            parts.push(WindowPart {
                index,
                input_tokens: w.input.len(),
                tokens: tokens[k..k + len].to_vec(),
                stored: self
                    .save
                    .then(|| stored[k * hidden..(k + len) * hidden].to_vec()),
                rank: 0,
                finished_s: 0.0,
            });
            k += len;
        }
        Ok(parts)
    }

    /// The base's final hidden states at the scored positions, f32: computed, or stored (the
    /// rows were checked against the plan when the file was loaded).
    fn base_rows(
        &self,
        unit: &[usize],
        batch: &[Window],
        ids: &Tensor,
        scored: usize,
    ) -> Result<Tensor, ModelError> {
        match &self.base.file {
            None => Ok(
                eval::scored_rows(&self.base.llama.hidden_states(ids)?, batch)?
                    .0
                    .to_dtype(DType::F32)?,
            ),
            Some(f) => {
                let rows: Vec<f32> = unit
                    .iter()
                    .flat_map(|&i| f.windows[i].iter().copied())
                    .collect();
                let hidden = self.base.llama.config.hidden_size;
                Ok(Tensor::from_vec(rows, (scored, hidden), &Device::Cpu)?)
            }
        }
    }

    /// Per scored token, both distributions compared, [`LOGIT_ROWS`] rows at a time.
    fn compare_tokens(
        &self,
        rows_m: &Tensor,
        rows_b: &Tensor,
        targets: &[u32],
    ) -> Result<Vec<TokenComparison>, ModelError> {
        let vocab = self.model.config.vocab_size;
        let mut tokens = Vec::with_capacity(targets.len());
        let mut r = 0;
        while r < targets.len() {
            let n = LOGIT_ROWS.min(targets.len() - r);
            let logits = |m: &Llama, rows: &Tensor| -> Result<Vec<f32>, ModelError> {
                Ok(m.logits(&rows.narrow(0, r, n)?)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            };
            let lm = logits(self.model, rows_m)?;
            let lb = logits(&self.base.llama, rows_b)?;
            tokens.extend(kld::compare_rows(&lb, &lm, vocab, &targets[r..r + n]));
            r += n;
        }
        Ok(tokens)
    }
}
