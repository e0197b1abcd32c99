//! The x86 pieces of the float driver: what every kernel's register tiles share (a tile's lane
//! sums taken from `acc` where its pass continues earlier chunks, zero where it starts at the
//! first, and stored back after; the order of each lane's additions is the kernels' own), and
//! the reduction of each output's eight lanes in ggml's `hsum_float_8` order, written to the
//! output.

use std::arch::x86_64::*;

use super::{Lanes, SumsOut, LANES, PANEL};

/// Pairs of panel rows: a 512-bit register holds row `2q`'s eight lanes in its low half and row
/// `2q + 1`'s in its high half.
const PAIRS: usize = PANEL / 2;

/// The 256-bit sums of weight rows `c0..c0 + C` × panel rows `row0..row0 + R` (one row's
/// eight lanes each): what `acc` holds when `resume`, else zero.
///
/// # Safety
/// The CPU must support AVX; `row0 + R <= PANEL`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sums256<const R: usize, const C: usize>(
    acc: &[Lanes],
    c0: usize,
    row0: usize,
    resume: bool,
) -> [[__m256; C]; R] {
    debug_assert!(row0 + R <= PANEL);
    if !resume {
        return [[_mm256_setzero_ps(); C]; R];
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|c| _mm256_loadu_ps(acc[c0 + c].as_ptr().add((row0 + r) * LANES)))
    })
}

/// Stores [`sums256`]'s registers back into `acc`.
///
/// # Safety
/// As [`sums256`].
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn store256<const R: usize, const C: usize>(
    acc: &mut [Lanes],
    c0: usize,
    row0: usize,
    sums: &[[__m256; C]; R],
) {
    debug_assert!(row0 + R <= PANEL);
    for (r, sums_r) in sums.iter().enumerate() {
        for (c, s) in sums_r.iter().enumerate() {
            _mm256_storeu_ps(acc[c0 + c].as_mut_ptr().add((row0 + r) * LANES), *s);
        }
    }
}

/// The 512-bit sums of weight rows `c0..c0 + C` × the panel's [`PAIRS`] pairs of rows: what
/// `acc` holds when `resume`, else zero.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn sums512<const C: usize>(
    acc: &[Lanes],
    c0: usize,
    resume: bool,
) -> [[__m512; C]; PAIRS] {
    if !resume {
        return [[_mm512_setzero_ps(); C]; PAIRS];
    }
    std::array::from_fn(|q| {
        std::array::from_fn(|c| _mm512_loadu_ps(acc[c0 + c].as_ptr().add(2 * q * LANES)))
    })
}

/// Stores [`sums512`]'s registers back into `acc`.
///
/// # Safety
/// As [`sums512`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn store512<const C: usize>(
    acc: &mut [Lanes],
    c0: usize,
    sums: &[[__m512; C]; PAIRS],
) {
    for (q, sums_q) in sums.iter().enumerate() {
        for (c, s) in sums_q.iter().enumerate() {
            _mm512_storeu_ps(acc[c0 + c].as_mut_ptr().add(2 * q * LANES), *s);
        }
    }
}

/// The sums of the eight rows of lanes, each as ggml's `hsum_float_8` orders it
/// (`((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`), eight rows at once: the same additions as
/// the scalar order, transposed.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn reduce(lanes: &Lanes) -> [f32; PANEL] {
    let v: [__m256; PANEL] =
        std::array::from_fn(|r| _mm256_loadu_ps(lanes.as_ptr().add(r * LANES)));
    let mut out = [0f32; PANEL];
    _mm256_storeu_ps(out.as_mut_ptr(), hsum8_x8(v));
    out
}

/// [`super::write_sums`]: eight weight rows at a time, their sums gathered across
/// weight rows (the same additions as [`reduce`]) so that the eight outputs are
/// neighbours in an output row; the last `acc.len() mod 8` rows by [`reduce`].
///
/// # Safety
/// The CPU must support AVX2; `dst` holds every output (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn write_sums(acc: &[Lanes], live: usize, dst: SumsOut<'_>) {
    let at = |r: usize, c: usize| dst.out.at(dst.row0 + r, dst.col0 + c);
    let grouped = acc.len() / PANEL * PANEL;
    for c in (0..grouped).step_by(PANEL) {
        for r in 0..live {
            let v: [__m256; PANEL] =
                std::array::from_fn(|i| _mm256_loadu_ps(acc[c + i].as_ptr().add(r * LANES)));
            _mm256_storeu_ps(at(r, c), hsum8_x8(v));
        }
    }
    for (c, lanes) in acc.iter().enumerate().skip(grouped) {
        let sums = reduce(lanes);
        for (r, &sum) in sums.iter().enumerate().take(live) {
            *at(r, c) = sum;
        }
    }
}

/// The eight vectors' sums of their lanes, in order, each as ggml's `hsum_float_8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum8_x8(v: [__m256; PANEL]) -> __m256 {
    // [a0+a4, a1+a5, a2+a6, a3+a7] of rows r and r+1 in the two 128-bit halves.
    let fold = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let (t01, t23, t45, t67) = (
        fold(v[0], v[1]),
        fold(v[2], v[3]),
        fold(v[4], v[5]),
        fold(v[6], v[7]),
    );
    // [(a0+a4)+(a2+a6), (a1+a5)+(a3+a7)] of rows (0, 2 | 1, 3) and (4, 6 | 5, 7).
    let pair = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(a, b),
            _mm256_shuffle_ps::<0xEE>(a, b),
        )
    };
    let (s03, s47) = (pair(t01, t23), pair(t45, t67));
    // The two halves added: rows (0, 2, 4, 6 | 1, 3, 5, 7).
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(s03, s47),
        _mm256_shuffle_ps::<0xDD>(s03, s47),
    );
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}
