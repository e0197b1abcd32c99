//! Q3_K weights repacked at load into interleaved groups of [`GROUP`](super::GROUP) rows,
//! × Q8_K activations: the kernels of [`super::q6k`] ([`SixteenSubBlocks`]: sixteen 16-value
//! sub-blocks with signed byte scales, no mins), which need from Q3_K only where its values
//! lie. Its values are stored unsigned, `u = q + 4` (0..8: the two low bits, and the high bit
//! as bit 2, which is ggml's "not minus 4"), its 6-bit scales unpacked to signed bytes (less
//! 32).
//!
//! Layout, per group of sixteen rows and super-block (1824 bytes for the file's 16 × 110):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`;
//! - `[32, 288)`: the scales, sub-block `s` at `32 + 16s`, row `j`'s at byte `j`;
//! - `[288, 1312)`: the low two bits, one 64-byte run per sub-block: run `s`, byte `4j + c`,
//!   bits `2t, 2t + 1` for value `16s + 4t + c` of row `j` (Q6_K's layout of its top bits);
//! - `[1312, 1824)`: the high bits, one 64-byte run per pair of sub-blocks: run `p`, byte
//!   `4j + c`, bit `4r + t` for value `16(2p + r) + 4t + c` of row `j`.
//!
//! The AVX-512 levels unpack all sixteen rows at once, the AVX2 unpacking's operations on
//! 512-bit registers (instead of the trait's default, the two AVX2 halves side by side: 2%
//! more GOP/s on a Zen 4 EPYC, m = 512, 2 threads, 554–570 → 566–582 over four alternations).
//!
//! Float order: [`super::q6k`]'s, `acc = fma(d_w·d_a, Σ_s scale_s·Σ_e q_e·a_e as f32, acc)`
//! over the super-blocks in order, from zero, on every level (ggml's structure: one
//! `d_w·d_a` product per super-block of an exact integer sum).

use super::q6k::{SixteenSubBlocks, SubBlockValues, SCALES, VALUES};
use super::Rows16Matrix;
use crate::model::kernels::kquant::q3k::Q3KBlock;
use crate::model::kernels::kquant::SuperBlock;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Offset of the low two bits in a group's super-block.
pub(super) const LOW: usize = VALUES;
/// Offset of the high bits.
const HIGH: usize = LOW + 16 * 64;

/// The Q3_K values: two low bits and a high bit.
pub struct Q3KValues;

/// The Q3_K format of the interleaved-rows driver.
pub type Q3K = SixteenSubBlocks<Q3KValues>;

/// A Q3_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`](super::GROUP)
/// rows: 114 bytes per super-block (the file's 110, the scales unpacked), plus the last
/// group's padding rows.
pub type Q3KRows16 = Rows16Matrix<Q3K>;

/// Sixteen bytes from `at` as one little-endian word.
fn word16(at: &[u8]) -> u128 {
    u128::from_le_bytes(at[..16].try_into().expect("16 bytes"))
}

/// Bytes `c` of the four 32-bit words of `x`, each at most `mask`, packed into byte `c` of
/// one word at bit offsets 0, `width`, `2·width`, `3·width` (nothing crosses a byte).
fn interleave(x: u128, width: u32) -> u32 {
    (0..4).fold(0, |acc, t| acc | ((x >> (32 * t)) as u32) << (width * t))
}

impl SubBlockValues for Q3KValues {
    const NAME: &'static str = "Q3_K";
    const FILE_BLOCK_BYTES: usize = Q3KBlock::FILE_BYTES;
    const GROUP_BLOCK_BYTES: usize = HIGH + 8 * 64;
    const OFFSET_BITS: u32 = 2;
    /// All four: 4 · 2 · 7 · 128 = 7168, a `madd` per sub-block instead of two.
    const STEPS_IN_16_BITS: usize = 4;

    /// By structure, sixteen values at a time: sub-block `s = 8n + 2j + r` holds values
    /// `128n + 32j + 16r + i` (i < 16), whose low bits are bits `2j` of the sixteen `qs`
    /// bytes from `32n + 16r` and high bits bit `4n + j` of the `hmask` bytes from `16r`.
    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        const ONE_BIT: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
        let blk = Q3KBlock::decode(file);
        dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.to_le_bytes());
        for (s, &scale) in blk.scales.iter().enumerate() {
            dst[SCALES + 16 * s + lane] = scale as u8;
        }
        let (qs, hmask) = blk.bits();
        pack_low_bits(qs, dst, lane);
        for s in 0..16 {
            let (n, j, r) = (s / 8, (s % 8) / 2, s % 2);
            let high = (word16(&hmask[16 * r..]) >> (4 * n + j)) & ONE_BIT;
            let high = (interleave(high, 1) << (4 * r)).to_le_bytes();
            let run = &mut dst[HIGH + 64 * (s / 2) + 4 * lane..][..4];
            for (d, h) in run.iter_mut().zip(high) {
                *d = if r == 0 { h } else { *d | h };
            }
        }
    }

    fn value(src: &[u8], lane: usize, e: usize) -> u8 {
        let (s, t, c) = (e / 16, (e % 16) / 4, e % 4);
        let low = low_bits(src, lane, e);
        let high = (src[HIGH + 64 * (s / 2) + 4 * lane + c] >> (4 * (s % 2) + t)) & 1;
        low | high << 2
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn values_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4] {
        let at = |offset: usize| src.add(offset + 32 * half) as *const __m256i;
        let lows = low_bits_avx2(src, s, half);
        // Sub-block 2p + 1's high bits down to where 2p's are.
        let count = _mm_cvtsi32_si128(4 * (s % 2) as i32);
        let high = _mm256_srl_epi16(_mm256_loadu_si256(at(HIGH + 64 * (s / 2))), count);
        let bit2 = _mm256_set1_epi8(4);
        // Value t's high bit is bit t of its byte; it goes to bit 2 (16-bit shifts: what
        // crosses a byte is masked off).
        let highs = [
            _mm256_slli_epi16::<2>(high),
            _mm256_slli_epi16::<1>(high),
            high,
            _mm256_srli_epi16::<1>(high),
        ];
        std::array::from_fn(|t| _mm256_or_si256(lows[t], _mm256_and_si256(highs[t], bit2)))
    }

    /// [`Self::values_avx2`] on whole 64-byte runs.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn values_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
        let at = |offset: usize| src.add(offset) as *const __m512i;
        let lows = low_bits_avx512(src, s);
        let count = _mm_cvtsi32_si128(4 * (s % 2) as i32);
        let high = _mm512_srl_epi16(_mm512_loadu_si512(at(HIGH + 64 * (s / 2))), count);
        let bit2 = _mm512_set1_epi8(4);
        let highs = [
            _mm512_slli_epi16::<2>(high),
            _mm512_slli_epi16::<1>(high),
            high,
            _mm512_srli_epi16::<1>(high),
        ];
        std::array::from_fn(|t| _mm512_or_si512(lows[t], _mm512_and_si512(highs[t], bit2)))
    }
}

/// Writes the two-bit fields of a super-block's 64 `qs` bytes (value `128n + 32j + 16r + i`
/// at bit `2j` of byte `32n + 16r + i`: Q3_K's low bits, Q2_K's values) into lane `lane`'s
/// runs from [`LOW`], by structure, sixteen values at a time.
pub(super) fn pack_low_bits(qs: &[u8; 64], dst: &mut [u8], lane: usize) {
    const TWO_BITS: u128 = 0x0303_0303_0303_0303_0303_0303_0303_0303;
    for s in 0..16 {
        let (n, j, r) = (s / 8, (s % 8) / 2, s % 2);
        let low = (word16(&qs[32 * n + 16 * r..]) >> (2 * j)) & TWO_BITS;
        let low = interleave(low, 2).to_le_bytes();
        dst[LOW + 64 * s + 4 * lane..][..4].copy_from_slice(&low);
    }
}

/// The two-bit field of value `e` of lane `lane` ([`pack_low_bits`]'s layout).
pub(super) fn low_bits(src: &[u8], lane: usize, e: usize) -> u8 {
    let (s, t, c) = (e / 16, (e % 16) / 4, e % 4);
    (src[LOW + 64 * s + 4 * lane + c] >> (2 * t)) & 3
}

/// Sub-block `s`'s two-bit fields of rows `8·half..8·half + 8` as bytes, register `t` values
/// `16s + 4t..16s + 4t + 4` ([`super::q6k::SubBlockValues::values_avx2`]'s order).
///
/// # Safety
/// The CPU must support AVX2; `src` is a group's super-block in [`pack_low_bits`]'s layout.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn low_bits_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4] {
    let low = _mm256_loadu_si256(src.add(LOW + 64 * s + 32 * half) as *const __m256i);
    let two = _mm256_set1_epi8(3);
    let lows = [
        low,
        _mm256_srli_epi16::<2>(low),
        _mm256_srli_epi16::<4>(low),
        _mm256_srli_epi16::<6>(low),
    ];
    std::array::from_fn(|t| _mm256_and_si256(lows[t], two))
}

/// [`low_bits_avx2`] of all sixteen rows.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; `src` as for [`low_bits_avx2`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn low_bits_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
    let low = _mm512_loadu_si512(src.add(LOW + 64 * s) as *const __m512i);
    let two = _mm512_set1_epi8(3);
    let lows = [
        low,
        _mm512_srli_epi16::<2>(low),
        _mm512_srli_epi16::<4>(low),
        _mm512_srli_epi16::<6>(low),
    ];
    std::array::from_fn(|t| _mm512_and_si512(lows[t], two))
}

#[cfg(test)]
#[path = "q3k_tests.rs"]
mod tests;
