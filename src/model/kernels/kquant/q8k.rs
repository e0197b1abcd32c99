//! Activations quantized to Q8_K, as llama.cpp's x86 CPU backend quantizes them for K-quant
//! weights (`quantize_row_q8_K`, which on x86 is the reference `quantize_row_q8_K_ref`), and
//! packed in panels of [`PANEL`] rows for the K-quant micro-kernels.
//!
//! Per 256-value super-block: `max` is the first value of largest magnitude, `iscale =
//! −127/max`, `q = min(127, round_half_even(iscale·x))` (ggml's `nearest_int`, the
//! 1.5·2²³ trick), `d = 1/iscale` (f32, not rounded to f16), and 16 sums of 16 consecutive
//! `q`. An all-zero block has `d = 0` and zero values.

use rayon::prelude::*;

use super::super::panel::PANEL;
use super::QK_K;

/// Sums of 16 values per super-block.
pub const SUMS: usize = QK_K / 16;
/// Entries of [`Q8KPanel::sub_block_sums`] per super-block: pairs of 32-value sub-blocks.
pub const SUB_BLOCK_PAIRS: usize = QK_K / 64;

/// Activations `[m, k]` in Q8_K, panel by panel: panel `p`, super-block `b`, row `r` of the
/// panel at index `(p·nb + b)·PANEL + r`. Rows past `m` in the last panel are zero.
pub struct Q8KPanels {
    super_blocks: usize,
    qs: Vec<[i8; QK_K]>,
    d: Vec<f32>,
    bsums: Vec<[i16; SUMS]>,
    sub_block_sums: Vec<[i16; 2 * PANEL]>,
}

/// One panel's super-blocks.
#[derive(Clone, Copy)]
pub struct Q8KPanel<'a> {
    /// `qs[b·PANEL + r]`: row r's 256 values in super-block b.
    pub qs: &'a [[i8; QK_K]],
    /// `d[b·PANEL + r]`: row r's scale in super-block b.
    pub d: &'a [f32],
    /// `bsums[b·PANEL + r][i]`: row r's sum of values `16i .. 16i + 16` in super-block b.
    pub bsums: &'a [[i16; SUMS]],
    /// `sub_block_sums[b·SUB_BLOCK_PAIRS + t][2r + i]`: row r's sum of the 32 values of
    /// sub-block `2t + i` in super-block b (|sum| ≤ 32·127), laid out so that one `madd`
    /// against a pair of per-sub-block weights (Q4_K/Q5_K's mins) gives all eight rows' terms.
    pub sub_block_sums: &'a [[i16; 2 * PANEL]],
}

impl Q8KPanels {
    /// Quantizes `x [m, k]` (row-major; `k` a multiple of [`QK_K`]).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(QK_K) && x.len() == m * k,
            "activation shape"
        );
        let nb = k / QK_K;
        let panels = m.div_ceil(PANEL);
        let mut out = Q8KPanels {
            super_blocks: nb,
            qs: vec![[0; QK_K]; panels * nb * PANEL],
            d: vec![0.0; panels * nb * PANEL],
            bsums: vec![[0; SUMS]; panels * nb * PANEL],
            sub_block_sums: vec![[0; 2 * PANEL]; panels * nb * SUB_BLOCK_PAIRS],
        };
        out.qs
            .par_chunks_mut(nb * PANEL)
            .zip(out.d.par_chunks_mut(nb * PANEL))
            .zip(out.bsums.par_chunks_mut(nb * PANEL))
            .zip(out.sub_block_sums.par_chunks_mut(nb * SUB_BLOCK_PAIRS))
            .enumerate()
            .for_each(|(p, (((qs, d), bsums), sub_block_sums))| {
                for r in 0..PANEL.min(m - p * PANEL) {
                    let row = &x[(p * PANEL + r) * k..][..k];
                    for (b, block) in row.chunks_exact(QK_K).enumerate() {
                        let i = b * PANEL + r;
                        d[i] = quantize_super_block(block, &mut qs[i], &mut bsums[i]);
                        for (s, pair) in bsums[i].chunks_exact(2).enumerate() {
                            let entry = &mut sub_block_sums[b * SUB_BLOCK_PAIRS + s / 2];
                            entry[2 * r + s % 2] = pair[0] + pair[1];
                        }
                    }
                }
            });
        out
    }

    /// Super-blocks per row.
    pub fn super_blocks(&self) -> usize {
        self.super_blocks
    }

    pub fn panel(&self, p: usize) -> Q8KPanel<'_> {
        let nb = self.super_blocks;
        let rows = p * nb * PANEL..(p + 1) * nb * PANEL;
        Q8KPanel {
            qs: &self.qs[rows.clone()],
            d: &self.d[rows.clone()],
            bsums: &self.bsums[rows],
            sub_block_sums: &self.sub_block_sums
                [p * nb * SUB_BLOCK_PAIRS..(p + 1) * nb * SUB_BLOCK_PAIRS],
        }
    }
}

/// ggml's `nearest_int`: round to nearest, ties to even, for |v| < 2²² (here |v| ≤ 127).
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// One super-block of 256 values: the values into `q`, the 16 sums of 16 into `sums`;
/// returns `d`.
pub(crate) fn quantize_super_block(x: &[f32], q: &mut [i8; QK_K], sums: &mut [i16; SUMS]) -> f32 {
    quantize_super_block_with(super::super::isa(), x, q, sums)
}

/// [`quantize_super_block`] at instruction-set level `isa`, lowered to what this process may
/// use: every level gives the same bits (tests run each).
pub(crate) fn quantize_super_block_with(
    isa: super::super::Isa,
    x: &[f32],
    q: &mut [i8; QK_K],
    sums: &mut [i16; SUMS],
) -> f32 {
    assert_eq!(x.len(), QK_K);
    #[cfg(target_arch = "x86_64")]
    if isa.min(super::super::isa()) >= super::super::Isa::Avx512 {
        // SAFETY: AVX-512 F/BW/VL were detected and seen to execute; `x` holds QK_K values.
        return unsafe { avx512::quantize_super_block(x, q, sums) };
    }
    let _ = isa;
    quantize_super_block_portable(x, q, sums)
}

/// The definition, one value at a time (llama.cpp's `quantize_row_q8_K_ref`).
fn quantize_super_block_portable(x: &[f32], q: &mut [i8; QK_K], sums: &mut [i16; SUMS]) -> f32 {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    // llama.cpp keeps the first value of largest magnitude (a strict `>` scan), sign included.
    let max = match x.iter().find(|v| v.abs() == amax) {
        Some(&max) if amax != 0.0 => max,
        _ => {
            q.fill(0);
            sums.fill(0);
            return 0.0;
        }
    };
    let iscale = -127.0 / max;
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, group) in sums.iter_mut().zip(q.chunks_exact(16)) {
        *s = group.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{QK_K, SUMS};
    use std::arch::x86_64::*;

    /// [`super::quantize_super_block_portable`] sixteen values per register: the same IEEE
    /// product `iscale·x`, the same `nearest_int` bit trick and clamp per value, and exact
    /// integer sums; the maximum is exact in any grouping (a NaN is skipped, as `f32::max`
    /// skips it: `max_ps` returns its second operand, the running maximum, when either is
    /// NaN), and the first value of that magnitude is found in index order. Profile of the
    /// Llama-3.2-1B shape in Q6_K: the scalar loop was 5.7% of the run.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_super_block(
        x: &[f32],
        q: &mut [i8; QK_K],
        sums: &mut [i16; SUMS],
    ) -> f32 {
        let p = x.as_ptr();
        let mut running = _mm512_setzero_ps();
        for c in 0..SUMS {
            running = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(p.add(16 * c))), running);
        }
        let amax = _mm512_reduce_max_ps(running);
        if amax == 0.0 || amax.is_nan() {
            // `amax` is never NaN (NaNs were skipped); zero: the portable path's zero block.
            q.fill(0);
            sums.fill(0);
            return 0.0;
        }
        let target = _mm512_set1_ps(amax);
        let mut max = 0f32;
        for c in 0..SUMS {
            let v = _mm512_loadu_ps(p.add(16 * c));
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), target);
            if hit != 0 {
                max = *x.get_unchecked(16 * c + hit.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let scale = _mm512_set1_ps(iscale);
        let magic = _mm512_set1_ps(12_582_912.0);
        let mantissa = _mm512_set1_epi32(0x007F_FFFF);
        let bias = _mm512_set1_epi32(0x0040_0000);
        let ceiling = _mm512_set1_epi32(127);
        let out = q.as_mut_ptr() as *mut __m128i;
        for (c, sum) in sums.iter_mut().enumerate() {
            let v = _mm512_mul_ps(scale, _mm512_loadu_ps(p.add(16 * c)));
            let bits = _mm512_castps_si512(_mm512_add_ps(v, magic));
            let n = _mm512_sub_epi32(_mm512_and_si512(bits, mantissa), bias);
            let n = _mm512_min_epi32(n, ceiling);
            // Truncating narrowing, as `as i8` (every value is in −127..127 here).
            _mm_storeu_si128(out.add(c), _mm512_cvtepi32_epi8(n));
            *sum = _mm512_reduce_add_epi32(n) as i16;
        }
        1.0 / iscale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_quantizes_to_the_same_bits() {
        use super::super::super::panel::tests::{available_isas, lcg};
        let mut seed = 77u64;
        let mut blocks: Vec<Vec<f32>> = (0..50)
            .map(|i| {
                let scale = [1e-3f32, 1.0, 300.0][i % 3];
                (0..QK_K).map(|_| lcg(&mut seed) * scale).collect()
            })
            .collect();
        // Ties of magnitude (the first wins, sign included), a zero block, halves to round.
        let mut tie = vec![0.25f32; QK_K];
        (tie[40], tie[41], tie[200]) = (-5.0, 5.0, -5.0);
        blocks.push(tie);
        blocks.push(vec![0.0; QK_K]);
        blocks.push((0..QK_K).map(|i| (i as f32 - 128.0) * 0.5).collect());
        let mut nan = vec![1.0f32; QK_K];
        nan[3] = f32::NAN;
        blocks.push(nan);
        for (b, x) in blocks.iter().enumerate() {
            let (mut q0, mut s0) = ([0i8; QK_K], [0i16; SUMS]);
            let d0 = quantize_super_block_portable(x, &mut q0, &mut s0);
            for isa in available_isas() {
                let (mut q, mut s) = ([0i8; QK_K], [0i16; SUMS]);
                let d = quantize_super_block_with(isa, x, &mut q, &mut s);
                assert_eq!(
                    (d.to_bits(), q, s),
                    (d0.to_bits(), q0, s0),
                    "{isa:?} block {b}"
                );
            }
        }
    }

    #[test]
    fn quantization_follows_llama_cpp() {
        let mut x = vec![0f32; QK_K];
        x[0] = -1.0;
        x[7] = 127.0; // the first of the two largest magnitudes: max = 127, iscale = −1
        x[8] = -127.0;
        x[1] = 2.5; // ties go to even: −2.5 → −2
        x[2] = -3.5; // 3.5 → 4
        x[20] = 0.49;
        let (mut q, mut sums) = ([0i8; QK_K], [0i16; 16]);
        let d = quantize_super_block(&x, &mut q, &mut sums);
        assert_eq!(d, -1.0);
        assert_eq!(&q[..9], &[1, -2, 4, 0, 0, 0, 0, -127, 127]);
        assert_eq!(q[20], 0);
        assert_eq!(sums[0], 1 - 2 + 4 - 127 + 127);
        assert_eq!(d, 1.0 / (-127.0f32 / 127.0));
        let d0 = quantize_super_block(&[0f32; QK_K], &mut q, &mut sums);
        assert_eq!((d0, q, sums), (0.0, [0; QK_K], [0; 16]));
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [(0.5, 0), (1.5, 2), (-2.5, -2), (126.5, 126), (-127.0, -127)] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        for i in -1270..=1270 {
            let v = i as f32 * 0.1;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn panels_hold_rows_in_place_and_pad_with_zeros() {
        let mut seed = 9u64;
        let (m, k) = (11, 512);
        let x: Vec<f32> = (0..m * k)
            .map(|_| super::super::super::panel::tests::lcg(&mut seed))
            .collect();
        let a = Q8KPanels::quantize(&x, m, k);
        for row in 0..m {
            let p = a.panel(row / PANEL);
            let r = row % PANEL;
            for b in 0..2 {
                let (mut q, mut sums) = ([0i8; QK_K], [0i16; 16]);
                let d = quantize_super_block(&x[row * k + b * QK_K..][..QK_K], &mut q, &mut sums);
                let i = b * PANEL + r;
                assert_eq!((p.qs[i], p.d[i], p.bsums[i]), (q, d, sums));
                for s in 0..8 {
                    let entry = p.sub_block_sums[b * SUB_BLOCK_PAIRS + s / 2];
                    assert_eq!(entry[2 * r + s % 2], sums[2 * s] + sums[2 * s + 1]);
                }
            }
        }
        let pad = a.panel(1);
        assert!(pad.qs[PANEL - 1] == [0; QK_K] && pad.d[PANEL - 1] == 0.0);
        assert_eq!(pad.bsums[PANEL - 1], [0; SUMS]);
    }
}
