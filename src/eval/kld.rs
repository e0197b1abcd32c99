//! Quantized-vs-base comparison on the same tokens (`ppl compare`), as llama.cpp's
//! KL-divergence mode reports it, but from both models' logits in full precision (f64
//! log-softmax of f32 logits) and without a logit file.
//!
//! Per scored token `i`, with base distribution `P` and model distribution `Q` over the
//! vocabulary: `KLD_i = Σ_v P_v (ln P_v − ln Q_v)`, `Δp_i = Q(target) − P(target)`, and whether
//! both put their highest probability on the same token. Summary statistics follow
//! llama.cpp's `perplexity --kl-divergence` output; uncertainties are standard errors of means
//! over tokens, the PPL ratio's from the paired per-token differences (so the correlation of
//! the two models' NLLs is accounted for).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// One scored token's comparison. On the wire (between ranks) it is the array
/// `[nll_base, nll_model, kld, delta_p, same_top]`: a third of the bytes of named fields,
/// and every f64 exact (`serde_json` is built with `float_roundtrip`).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(from = "TokenTuple", into = "TokenTuple")]
pub struct TokenComparison {
    pub nll_base: f64,
    pub nll_model: f64,
    pub kld: f64,
    pub delta_p: f64,
    pub same_top: bool,
}

/// [`TokenComparison`]'s wire form.
type TokenTuple = (f64, f64, f64, f64, bool);

impl From<TokenTuple> for TokenComparison {
    fn from((nll_base, nll_model, kld, delta_p, same_top): TokenTuple) -> Self {
        Self {
            nll_base,
            nll_model,
            kld,
            delta_p,
            same_top,
        }
    }
}

impl From<TokenComparison> for TokenTuple {
    fn from(t: TokenComparison) -> Self {
        (t.nll_base, t.nll_model, t.kld, t.delta_p, t.same_top)
    }
}

/// f64 log-softmax of a logit row and the index of its (first) largest logit.
fn log_softmax(row: &[f32]) -> (Vec<f64>, usize) {
    let (mut arg, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > max {
            (arg, max) = (i, v);
        }
    }
    let max = max as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    let ln = sum.ln();
    (row.iter().map(|&l| l as f64 - max - ln).collect(), arg)
}

/// Compares two logit rows for the same position and target.
pub fn compare_row(base: &[f32], model: &[f32], target: u32) -> TokenComparison {
    let (lp, top_b) = log_softmax(base);
    let (lq, top_m) = log_softmax(model);
    let t = target as usize;
    let kld: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
    TokenComparison {
        nll_base: -lp[t],
        nll_model: -lq[t],
        // Rounding can leave a hair below zero for (nearly) identical rows; KLD is ≥ 0.
        kld: kld.max(0.0),
        delta_p: lq[t].exp() - lp[t].exp(),
        same_top: top_b == top_m,
    }
}

/// Rows of logits (`vocab` wide) of both models against their targets, rows in parallel.
pub fn compare_rows(
    base: &[f32],
    model: &[f32],
    vocab: usize,
    targets: &[u32],
) -> Vec<TokenComparison> {
    base.par_chunks(vocab)
        .zip(model.par_chunks(vocab))
        .zip(targets.par_iter())
        .map(|((b, m), &t)| compare_row(b, m, t))
        .collect()
}

/// A value with its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub value: f64,
    pub err: f64,
}

/// Percentiles of a distribution, as llama.cpp lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub max: f64,
    pub p99_9: f64,
    pub p99: f64,
    pub p95: f64,
    pub p90: f64,
    pub median: f64,
    pub p10: f64,
    pub p5: f64,
    pub p1: f64,
    pub p0_1: f64,
    pub min: f64,
}

impl Percentiles {
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| -> f64 {
            if v.is_empty() {
                return f64::NAN;
            }
            // Linear interpolation between closest ranks.
            let pos = q * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Self {
            max: at(1.0),
            p99_9: at(0.999),
            p99: at(0.99),
            p95: at(0.95),
            p90: at(0.90),
            median: at(0.5),
            p10: at(0.10),
            p5: at(0.05),
            p1: at(0.01),
            p0_1: at(0.001),
            min: at(0.0),
        }
    }
}

/// The comparison's summary (`--output` JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub tokens: usize,
    pub ppl_base: f64,
    pub ppl_base_err: f64,
    pub ppl_model: f64,
    pub ppl_model_err: f64,
    /// Pearson correlation of the two models' per-token NLLs.
    pub cor_ln_ppl: f64,
    /// Mean of `ln(PPL(model)/PPL(base))` per token, with its paired standard error.
    pub mean_ln_ratio: Estimate,
    pub ppl_ratio: Estimate,
    pub delta_ppl: f64,
    pub delta_ppl_err: f64,
    pub kld_mean: f64,
    pub kld_mean_err: f64,
    pub kld_percentiles: Percentiles,
    pub delta_p_mean: Estimate,
    pub delta_p_rms: f64,
    pub delta_p_percentiles: Percentiles,
    /// Percent of tokens where both models' most likely token is the same.
    pub same_top: f64,
    pub same_top_err: f64,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Mean and standard error of the mean.
fn mean_err(v: &[f64]) -> Estimate {
    let n = v.len() as f64;
    let m = mean(v);
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    Estimate {
        value: m,
        err: (var / n).sqrt(),
    }
}

/// Summarises per-token comparisons (at least one token).
pub fn summarize(t: &[TokenComparison]) -> Summary {
    let n = t.len() as f64;
    let nb: Vec<f64> = t.iter().map(|x| x.nll_base).collect();
    let nm: Vec<f64> = t.iter().map(|x| x.nll_model).collect();
    let diff: Vec<f64> = t.iter().map(|x| x.nll_model - x.nll_base).collect();
    let kld: Vec<f64> = t.iter().map(|x| x.kld).collect();
    let dp: Vec<f64> = t.iter().map(|x| x.delta_p).collect();
    let (b, m) = (mean_err(&nb), mean_err(&nm));
    let (ppl_b, ppl_m) = (b.value.exp(), m.value.exp());
    let cov = nb
        .iter()
        .zip(&nm)
        .map(|(x, y)| (x - b.value) * (y - m.value))
        .sum::<f64>()
        / (n - 1.0).max(1.0);
    let sd = |e: &Estimate| e.err * n.sqrt();
    let cor = cov / (sd(&b) * sd(&m));
    let ratio = mean_err(&diff);
    // ΔPPL by the delta method with the covariance of the two mean NLLs.
    let var_delta = ppl_m.powi(2) * m.err.powi(2) + ppl_b.powi(2) * b.err.powi(2)
        - 2.0 * ppl_m * ppl_b * cov / n;
    let k = mean_err(&kld);
    let same = t.iter().filter(|x| x.same_top).count() as f64 / n;
    Summary {
        tokens: t.len(),
        ppl_base: ppl_b,
        ppl_base_err: ppl_b * b.err,
        ppl_model: ppl_m,
        ppl_model_err: ppl_m * m.err,
        cor_ln_ppl: cor,
        mean_ln_ratio: ratio,
        ppl_ratio: Estimate {
            value: ratio.value.exp(),
            err: ratio.value.exp() * ratio.err,
        },
        delta_ppl: ppl_m - ppl_b,
        delta_ppl_err: var_delta.max(0.0).sqrt(),
        kld_mean: k.value,
        kld_mean_err: k.err,
        kld_percentiles: Percentiles::of(&kld),
        delta_p_mean: mean_err(&dp),
        delta_p_rms: (dp.iter().map(|x| x * x).sum::<f64>() / n).sqrt(),
        delta_p_percentiles: Percentiles::of(&dp),
        same_top: 100.0 * same,
        same_top_err: 100.0 * (same * (1.0 - same) / (n - 1.0).max(1.0)).sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: u64, n: usize) -> Vec<f32> {
        crate::test_util::uniform(seed, n, 8.0)
    }

    #[test]
    fn a_model_against_itself_has_zero_kld_and_the_same_top() {
        let r = row(1, 1000);
        let c = compare_row(&r, &r, 17);
        assert_eq!(c.kld, 0.0);
        assert_eq!(c.delta_p, 0.0);
        assert!(c.same_top);
        assert_eq!(c.nll_base, c.nll_model);
    }

    #[test]
    fn kld_matches_the_definition_and_is_never_negative() {
        let p = [1.0f32, 2.0, 3.0];
        let q = [1.5f32, 1.0, 3.0];
        let sm = |r: &[f32]| -> Vec<f64> {
            let z: f64 = r.iter().map(|&x| (x as f64).exp()).sum();
            r.iter().map(|&x| (x as f64).exp() / z).collect()
        };
        let (pp, qq) = (sm(&p), sm(&q));
        let want: f64 = pp.iter().zip(&qq).map(|(a, b)| a * (a / b).ln()).sum();
        let c = compare_row(&p, &q, 0);
        assert!((c.kld - want).abs() < 1e-12);
        assert!((c.delta_p - (qq[0] - pp[0])).abs() < 1e-12);
        for seed in 0..50 {
            let (a, b) = (row(seed, 300), row(seed + 1000, 300));
            assert!(compare_row(&a, &b, 5).kld >= 0.0);
        }
    }

    #[test]
    fn summary_of_identical_models_and_of_a_shifted_one() {
        let rows: Vec<Vec<f32>> = (0..200).map(|s| row(s, 64)).collect();
        let same: Vec<TokenComparison> = rows.iter().map(|r| compare_row(r, r, 3)).collect();
        let s = summarize(&same);
        assert_eq!(s.kld_mean, 0.0);
        assert_eq!(s.same_top, 100.0);
        assert_eq!(s.delta_ppl, 0.0);
        assert!((s.cor_ln_ppl - 1.0).abs() < 1e-12);
        assert_eq!(s.ppl_ratio.value, 1.0);
        assert_eq!(s.kld_percentiles.min, 0.0);
        // A noisy copy: positive KLD, ratio near 1, a few top tokens differ.
        let noisy: Vec<TokenComparison> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let q: Vec<f32> = r
                    .iter()
                    .zip(row(i as u64 + 7, 64))
                    .map(|(a, e)| a + e * 0.01)
                    .collect();
                compare_row(r, &q, 3)
            })
            .collect();
        let s = summarize(&noisy);
        assert!(s.kld_mean > 0.0 && s.kld_percentiles.min >= 0.0);
        assert!(
            s.kld_percentiles.max >= s.kld_percentiles.p99
                && s.kld_percentiles.p99 >= s.kld_percentiles.median
        );
        assert!((s.ppl_ratio.value - 1.0).abs() < 0.05);
        assert!(s.same_top > 80.0 && s.same_top <= 100.0);
        assert!(s.cor_ln_ppl > 0.9);
    }
}
