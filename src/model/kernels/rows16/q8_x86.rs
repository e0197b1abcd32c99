//! The AVX-512 float steps shared by the formats on Q8_0/Q8_1 activations ([`super::q4`] and
//! [`super::q8_0`]): a group block's scales (and minima) as lanes, and one block's step per
//! panel row, so every format with minima (Q4_1, Q5_1) adds them in the same place.

use super::{Job, Q8Panel, GROUP};
use std::arch::x86_64::*;

/// Offset of the sixteen f16 minima in a group's block, after the sixteen scales.
pub(crate) const MINIMA: usize = 2 * GROUP;

/// A group block's sixteen `d` and (`MIN`) sixteen `m` as f32 lanes (`m` zero otherwise).
///
/// # Safety
/// The CPU must support AVX-512F and F16C; `src` holds the block's scales (and minima).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn scales<const MIN: bool>(src: *const u8) -> [__m512; 2] {
    let half = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(src.add(at) as *const __m256i));
    let mw = if MIN {
        half(MINIMA)
    } else {
        _mm512_setzero_ps()
    };
    [half(0), mw]
}

/// One block's float operations for panel entry `i` in sixteen weight rows' lanes, from their
/// exact integer sums `s`: `fma(d_w·d_a, s, acc)`, then (`MIN`) `fma(m_w, s_a, ·)`.
///
/// # Safety
/// As [`scales`]; entry `i` is within the panel (the driver checked its lengths).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn block_step<const MIN: bool>(
    job: &Job<'_, Q8Panel<'_>>,
    i: usize,
    [dw, mw]: [__m512; 2],
    s: __m512i,
    acc: __m512,
) -> __m512 {
    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*job.a.d.get_unchecked(i)));
    let acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc);
    if !MIN {
        return acc;
    }
    _mm512_fmadd_ps(mw, _mm512_set1_ps(*job.a.s.get_unchecked(i)), acc)
}
