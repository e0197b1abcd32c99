//! The x86 pieces every float kernel's register tiles share: a tile's lane sums taken from
//! `acc` where its pass continues earlier chunks (zero where it starts at the first), and
//! stored back after. The driver keeps `acc` between the slices of a panel's values; the
//! order of each lane's additions is the kernels' own.

use std::arch::x86_64::*;

use super::{Lanes, LANES, PANEL};

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
