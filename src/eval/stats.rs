//! Statistics over the scored tokens.
//!
//! - **± error** (llama.cpp): with `m` the mean NLL and `m2` the mean squared NLL over the N
//!   scored tokens, `s = sqrt((m2 − m²)/(N − 1))` and `PPL ± exp(m)·s` (delta method, tokens
//!   treated as independent).
//! - **95% CI** (block bootstrap): tokens in a window share context, so they are not
//!   independent. The resampling unit is a block: a window (`chunks`, `stride`) or a document
//!   (`rolling`). Each replicate draws as many blocks as there are, with replacement, and
//!   computes `exp(Σ nll / Σ tokens)` from the blocks' exact sums; the interval is the 2.5th and
//!   97.5th percentiles (linear interpolation) of the replicates. The generator is SplitMix64
//!   seeded with `--seed`, so the interval is reproducible.

use super::accumulator::{from_fixed, NllAccumulator};

/// llama.cpp's uncertainty of the PPL; `None` with fewer than two tokens.
pub fn ppl_error(acc: &NllAccumulator) -> Option<f64> {
    if acc.count < 2 {
        return None;
    }
    let m = acc.mean()?;
    let m2 = acc.mean_sq()?;
    let var = ((m2 - m * m) / (acc.count - 1) as f64).max(0.0);
    Some(m.exp() * var.sqrt())
}

/// SplitMix64: a small, well-mixed, reproducible generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform integer in `0..n` (Lemire's multiply-shift; bias < n/2^64).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Linear-interpolation percentile (`q` in 0..=1) of sorted values: numpy's default.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Block-bootstrap 95% interval of the perplexity; `None` with fewer than two blocks.
pub fn bootstrap_ci95(blocks: &[NllAccumulator], samples: usize, seed: u64) -> Option<[f64; 2]> {
    if blocks.len() < 2 || samples == 0 {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let mut ppls = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut sum: i128 = 0;
        let mut count: u64 = 0;
        for _ in 0..blocks.len() {
            let b = &blocks[rng.below(blocks.len())];
            sum += b.sum;
            count += b.count;
        }
        if count > 0 {
            ppls.push((from_fixed(sum) / count as f64).exp());
        }
    }
    ppls.sort_by(f64::total_cmp);
    Some([
        percentile_sorted(&ppls, 0.025)?,
        percentile_sorted(&ppls, 0.975)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_matches_llama_cpp_formula() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        let mut a = NllAccumulator::default();
        xs.iter().for_each(|&x| a.add(x));
        let m: f64 = 2.5;
        let m2: f64 = 7.5;
        let want = m.exp() * ((m2 - m * m) / 3.0).sqrt();
        assert!((ppl_error(&a).unwrap() - want).abs() < 1e-12);
        let mut one = NllAccumulator::default();
        one.add(1.0);
        assert_eq!(ppl_error(&one), None);
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile_sorted(&v, 0.5), Some(2.5));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(percentile_sorted(&v, 1.0), Some(4.0));
        assert!((percentile_sorted(&v, 0.025).unwrap() - 1.075).abs() < 1e-12);
    }

    #[test]
    fn bootstrap_is_reproducible_and_brackets_the_estimate() {
        let blocks: Vec<NllAccumulator> = (0..50)
            .map(|i| {
                let mut a = NllAccumulator::default();
                for j in 0..100 {
                    a.add(2.0 + ((i * 100 + j) as f64 * 0.37).sin());
                }
                a
            })
            .collect();
        let ci = bootstrap_ci95(&blocks, 1000, 7).unwrap();
        assert_eq!(ci, bootstrap_ci95(&blocks, 1000, 7).unwrap());
        assert_ne!(ci, bootstrap_ci95(&blocks, 1000, 8).unwrap());
        let mut total = NllAccumulator::default();
        blocks.iter().for_each(|b| total.merge(b));
        let ppl = total.perplexity().unwrap();
        assert!(ci[0] < ppl && ppl < ci[1], "{ci:?} vs {ppl}");
        assert_eq!(bootstrap_ci95(&blocks[..1], 1000, 7), None);
    }

    #[test]
    fn splitmix_reference_values() {
        // First outputs for seed 0 (reference values of the SplitMix64 algorithm).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }
}
