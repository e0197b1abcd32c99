//! Per-token negative log-likelihood from f32 logits, in f64.
//!
//! For a row of logits `l` and target `t`: `nll = ln Σ_i exp(l_i − max) − (l_t − max)`, with
//! the max subtracted first and every term computed and summed in f64 in index order, so the
//! value depends only on the row (never on threads or batch-mates). This is llama.cpp's
//! `log_softmax` with the exponentials also taken in double, as glibc's `exp` computes them
//! ([`crate::model::kernels::exp64`], vectorised with the same bits).

use rayon::prelude::*;

use crate::model::kernels::exp64::exp_sum;

/// NLL of one row of logits.
pub fn nll_row(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum = exp_sum(logits, max);
    sum.ln() - (logits[target as usize] as f64 - max)
}

/// NLLs of consecutive rows `logits[r*vocab..(r+1)*vocab]` against `targets[r]`, rows in
/// parallel (each row computed by one thread, so the result is thread-count independent).
pub fn nll_rows(logits: &[f32], vocab: usize, targets: &[u32]) -> Vec<f64> {
    assert_eq!(
        logits.len(),
        vocab * targets.len(),
        "logits/targets mismatch"
    );
    logits
        .par_chunks(vocab)
        .zip(targets.par_iter())
        .map(|(row, &t)| nll_row(row, t))
        .collect()
}

/// [`nll_rows`] for a `[rows, vocab]` f32 tensor on any device, computed where the logits
/// are (a GPU keeps the vocabulary-wide reductions; only one f64 per row comes back): the same
/// definition in f64, `ln Σ exp(l_i − max) − (l_t − max)`, with the device's summation order
/// and `exp`, so it agrees with [`nll_rows`] to about 1e-15 relative rather than to the bit.
pub fn nll_rows_on_device(
    logits: &candle_core::Tensor,
    targets: &[u32],
) -> candle_core::Result<Vec<f64>> {
    use candle_core::{DType, Tensor, D};
    let x = logits.to_dtype(DType::F64)?;
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let ids = Tensor::from_slice(targets, (targets.len(), 1), logits.device())?;
    let target = shifted.gather(&ids, D::Minus1)?;
    (log_sum - target)?.flatten_all()?.to_vec1::<f64>()
}

/// One rank's share of a row's log-softmax under a vocabulary split: the max of its logits,
/// `Σ exp(l − max)` over them, and the target's logit when the target is among them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PartialRow {
    pub max: f64,
    pub sum: f64,
    pub target: Option<f64>,
}

/// The partial row of `logits`, the columns `offset..offset + logits.len()` of the vocabulary.
pub fn partial_row(logits: &[f32], offset: usize, target: u32) -> PartialRow {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum = exp_sum(logits, max);
    let t = (target as usize)
        .checked_sub(offset)
        .filter(|&t| t < logits.len());
    PartialRow {
        max,
        sum,
        target: t.map(|t| logits[t] as f64),
    }
}

/// The NLL from every rank's partial row, combined in rank order:
/// `M = max_r m_r`, `S = Σ_r s_r·exp(m_r − M)`, `nll = ln S − (l_t − M)`. With one part this is
/// [`nll_row`] exactly; with several the sum is regrouped, so the value can differ from the
/// unsplit one in the last bits of the f64.
pub fn combine(parts: &[PartialRow]) -> Option<f64> {
    let max = parts
        .iter()
        .map(|p| p.max)
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = parts.iter().map(|p| p.sum * (p.max - max).exp()).sum();
    let target = parts.iter().find_map(|p| p.target)?;
    Some(sum.ln() - (target - max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition_and_is_stable_for_large_logits() {
        let row = [1.0f32, 2.0, 3.0];
        let denom: f64 = [1.0f64, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        let want = -(2.0f64.exp() / denom).ln();
        assert!((nll_row(&row, 1) - want).abs() < 1e-15);
        // Shifting every logit leaves the NLL unchanged and does not overflow.
        let shifted = [1001.0f32, 1002.0, 1003.0];
        assert!((nll_row(&shifted, 1) - want).abs() < 1e-12);
        let uniform = vec![0.0f32; 49152];
        assert!((nll_row(&uniform, 7) - (49152f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn split_rows_combine_to_the_whole_row() {
        let row: Vec<f32> = (0..1001)
            .map(|i| ((i * 17 % 89) as f32).cos() * 7.0)
            .collect();
        for target in [0u32, 500, 1000] {
            let whole = nll_row(&row, target);
            let one = combine(&[partial_row(&row, 0, target)]).unwrap();
            assert_eq!(one.to_bits(), whole.to_bits());
            for parts in [2usize, 3, 7] {
                let p: Vec<PartialRow> = (0..parts)
                    .map(|i| {
                        let r = crate::model::shard::split(row.len(), parts, i);
                        partial_row(&row[r.clone()], r.start, target)
                    })
                    .collect();
                let v = combine(&p).unwrap();
                assert!((v - whole).abs() <= 1e-12 * whole.abs(), "{v} vs {whole}");
            }
        }
        // A target that no part holds has no NLL.
        assert!(combine(&[partial_row(&row[..10], 0, 500)]).is_none());
    }

    /// The tensor form (what a GPU runs) against the host definition, on candle's CPU
    /// device: the same ops, so a wrong axis, shift or gather shows here.
    #[test]
    fn device_form_matches_the_host_definition() {
        let vocab = 49_152;
        let rows = 5;
        let logits: Vec<f32> = (0..vocab * rows)
            .map(|i| ((i * 7919 % 10_007) as f32 * 0.013).sin() * 9.0 + (i / vocab) as f32 * 300.0)
            .collect();
        let targets: Vec<u32> = vec![0, 49_151, 12_345, 7, 30_000];
        let host = nll_rows(&logits, vocab, &targets);
        let t = candle_core::Tensor::from_vec(logits, (rows, vocab), &candle_core::Device::Cpu)
            .unwrap();
        let device = nll_rows_on_device(&t, &targets).unwrap();
        assert_eq!(device.len(), rows);
        for (d, h) in device.iter().zip(&host) {
            assert!(*h > 1.0 && *h < 40.0, "{h}");
            assert!((d - h).abs() <= 1e-12 * h.abs(), "{d} vs {h}");
        }
    }

    #[test]
    fn rows_are_independent_of_parallel_split() {
        let vocab = 1000;
        let logits: Vec<f32> = (0..vocab * 37)
            .map(|i| ((i * 31 % 97) as f32).sin() * 5.0)
            .collect();
        let targets: Vec<u32> = (0..37).map(|i| (i * 13 % vocab) as u32).collect();
        let all = nll_rows(&logits, vocab, &targets);
        for (r, &v) in all.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                nll_row(&logits[r * vocab..(r + 1) * vocab], targets[r]).to_bits()
            );
        }
    }
}
