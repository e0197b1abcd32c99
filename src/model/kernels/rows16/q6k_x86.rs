//! The x86 micro-kernels of [`super`], generic over the values' layout
//! ([`SubBlockValues`]): one 32-bit lane per weight row of the group, so each output's
//! sub-block sums form in its own lane; the same exact integers and the same float operations
//! per output as the portable kernel. Q6_K's values are unpacked here too
//! ([`q6k_values_avx2`], [`q6k_values_avx512`]).

use super::super::scaled_staged_bytes;
use super::super::scaled_tiles_x86::{accumulate_super_block, scales_in_both_halves, stage_row};
use super::super::shared_x86::q8k_word as activation_word;
use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::{GroupOut, Q6KJob, SubBlockValues, HIGH, NIBBLES, SCALES, SUB_BLOCKS};
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;
use std::ops::Range;

/// Every sub-block's offset, `−2^OFFSET_BITS·bsum` (the values' offset through the activation
/// sum), of super-block `b` for the panel's rows, `[row][sub-block]`:
/// made once per super-block in vector registers, so that the sub-block loop starts each sum
/// with a broadcast from memory (a load, not a vector-port operation and three scalar ones).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sub_block_offsets<V: SubBlockValues>(
    job: &Q6KJob<'_>,
    b: usize,
) -> [[i32; SUB_BLOCKS]; PANEL] {
    let mut offsets = [[0i32; SUB_BLOCKS]; PANEL];
    let count = _mm_cvtsi32_si128(V::OFFSET_BITS as i32);
    for (r, o) in offsets.iter_mut().enumerate() {
        let bsums = job.a.bsums.get_unchecked(b * PANEL + r);
        let wide = _mm512_cvtepi16_epi32(_mm256_loadu_si256(bsums.as_ptr() as *const __m256i));
        let minus = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sll_epi32(wide, count));
        _mm512_storeu_si512(o.as_mut_ptr() as *mut _, minus);
    }
    offsets
}

/// Sub-block `s`'s sixteen rows of Q6_K's 6-bit values as bytes: register `t` holds values
/// `16s + 4t..16s + 4t + 4` of every row (lane `j`: row `j`); 16-bit shifts, whatever crosses
/// a byte boundary is masked off.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; `src` is a Q6_K group's super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn q6k_values_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
    let (low, top) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let n0 = _mm512_loadu_si512(src.add(NIBBLES + 128 * s) as *const _);
    let n1 = _mm512_loadu_si512(src.add(NIBBLES + 128 * s + 64) as *const _);
    let h = _mm512_loadu_si512(src.add(HIGH + 64 * s) as *const _);
    [
        _mm512_or_si512(
            _mm512_and_si512(n0, low),
            _mm512_and_si512(_mm512_slli_epi16::<4>(h), top),
        ),
        _mm512_or_si512(
            _mm512_and_si512(n1, low),
            _mm512_and_si512(_mm512_slli_epi16::<2>(h), top),
        ),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(n0), low),
            _mm512_and_si512(h, top),
        ),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(n1), low),
            _mm512_and_si512(_mm512_srli_epi16::<2>(h), top),
        ),
    ]
}

/// Sixteen weight rows per 512-bit register; VNNI forms each lane's four products per step.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
/// checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_avx512<V: SubBlockValues>(job: &Q6KJob<'_>) -> GroupOut {
    let mut acc = [_mm512_setzero_ps(); PANEL];
    let mut acc_min = [_mm512_setzero_ps(); PANEL];
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * V::GROUP_BLOCK_BYTES);
        let mut sums = [_mm512_setzero_si512(); PANEL];
        let offsets = sub_block_offsets::<V>(job, b);
        for s in 0..SUB_BLOCKS {
            let w = V::values_avx512(src, s);
            let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(src.add(SCALES + 16 * s) as *const _));
            for (r, sum) in sums.iter_mut().enumerate() {
                let i = b * PANEL + r;
                let mut t = _mm512_set1_epi32(*offsets.get_unchecked(r).get_unchecked(s));
                for (step, w) in w.iter().enumerate() {
                    let a = _mm512_set1_epi32(activation_word(job, i, 16 * s + 4 * step));
                    t = _mm512_dpbusd_epi32(t, *w, a);
                }
                *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(t, scale));
            }
        }
        accumulate_super_block(job, src, b, &sums, &mut acc);
        if let Some(at) = V::MINS {
            accumulate_mins_avx512(job, src.add(at), b, &mut acc_min);
        }
    }
    if V::MINS.is_some() {
        for (acc, acc_min) in acc.iter_mut().zip(&acc_min) {
            *acc = _mm512_sub_ps(*acc, *acc_min);
        }
    }
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}

/// Super-block `b`'s mins term for the panel's rows, `mins` at the format's `dmin` (then its
/// min bytes, [`SubBlockValues::MINS`]): the exact `Σ_s min_s·bsum_s` in each row's lane, two
/// sub-blocks per `vpdpwssd` (a lane's two mins as i16 against the entry's two activation
/// sums), then `acc_min = fma(dmin_w·d_a, mins, acc_min)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn accumulate_mins_avx512(
    job: &Q6KJob<'_>,
    mins: *const u8,
    b: usize,
    acc_min: &mut [__m512; PANEL],
) {
    let min = |s: usize| {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(
            mins.add(2 * super::GROUP + 16 * s) as *const _
        ))
    };
    let pairs: [__m512i; SUB_BLOCKS / 2] = std::array::from_fn(|t| {
        _mm512_or_si512(min(2 * t), _mm512_slli_epi32::<16>(min(2 * t + 1)))
    });
    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(mins as *const __m256i));
    for (r, acc_min) in acc_min.iter_mut().enumerate() {
        let i = b * PANEL + r;
        let bsums = job.a.bsums.get_unchecked(i).as_ptr();
        let mut total = _mm512_setzero_si512();
        for (t, pair) in pairs.iter().enumerate() {
            let a = _mm512_set1_epi32(bsums.add(2 * t).cast::<i32>().read_unaligned());
            total = _mm512_dpwssd_epi32(total, *pair, a);
        }
        let da = _mm512_set1_ps(*job.a.d.get_unchecked(i));
        *acc_min = _mm512_fmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(total), *acc_min);
    }
}

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass. `maddubs` forms each lane's two pairs of products per step (unsigned value times
/// activation), [`SubBlockValues::STEPS_IN_16_BITS`] steps are added in 16 bits (Q6_K two: a
/// pair is at most 2·63·128 = 16128, two of them 32256 < 2¹⁵; Q3_K all four: 4·2·7·128 =
/// 7168), and `madd` against the rows' scales (each 32-bit lane the scale twice) widens and
/// scales them at once. The values' offset is kept out of the
/// sub-block loop: `−2^OFFSET_BITS·Σ_s scale_s·bsum_s` per super-block, two sub-blocks per
/// `madd` ([`offsets_avx2`]). The same integer sum per super-block as the other levels (no partial
/// sum comes near 2³¹), with a third of the multiplies of a `madd` per step and a `mullo` per
/// sub-block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2<V: SubBlockValues>(job: &Q6KJob<'_>) -> GroupOut {
    let steps = const {
        assert!(
            4 % V::STEPS_IN_16_BITS == 0,
            "a sub-block's four steps in whole runs"
        );
        V::STEPS_IN_16_BITS
    };
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut acc_min = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * V::GROUP_BLOCK_BYTES);
            let pairs = scale_pairs_avx2(src, half);
            let mut sums = [_mm256_setzero_si256(); ROWS];
            for (dr, sum) in sums.iter_mut().enumerate() {
                *sum = offsets_avx2::<V>(job, &pairs, b * PANEL + r0 + dr);
            }
            for s in 0..SUB_BLOCKS {
                let w = V::values_avx2(src, s, half);
                let scale = scales_twice_avx2(src.add(SCALES + 16 * s + 8 * half));
                for (dr, sum) in sums.iter_mut().enumerate() {
                    let i = b * PANEL + r0 + dr;
                    for (c, run) in w.chunks_exact(steps).enumerate() {
                        let step = |j: usize| {
                            let at = 16 * s + 4 * (c * steps + j);
                            let a = _mm256_set1_epi32(activation_word(job, i, at));
                            _mm256_maddubs_epi16(run[j], a)
                        };
                        let pairs = (1..steps).fold(step(0), |p, j| _mm256_add_epi16(p, step(j)));
                        *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, scale));
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(src.add(16 * half) as *const __m128i));
            for (dr, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
                let da = _mm256_set1_ps(*job.a.d.get_unchecked(b * PANEL + r0 + dr));
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(*sum), *acc);
            }
            if let Some(at) = V::MINS {
                // The mins term, as the AVX-512 kernel's: two sub-blocks per `madd`.
                let mins = src.add(at);
                let pairs = byte_pairs_avx2(|s| {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        mins.add(2 * super::GROUP + 16 * s + 8 * half) as *const __m128i,
                    ))
                });
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(mins.add(16 * half) as *const __m128i));
                for (dr, acc_min) in acc_min.iter_mut().enumerate() {
                    let i = b * PANEL + r0 + dr;
                    let total = bsum_pairs_dot_avx2(job, &pairs, i);
                    let da = _mm256_set1_ps(*job.a.d.get_unchecked(i));
                    let dmin_da = _mm256_mul_ps(dmin, da);
                    *acc_min = _mm256_fmadd_ps(dmin_da, _mm256_cvtepi32_ps(total), *acc_min);
                }
            }
        }
        if V::MINS.is_some() {
            for (acc, acc_min) in acc.iter_mut().zip(&acc_min) {
                *acc = _mm256_sub_ps(*acc, *acc_min);
            }
        }
        acc
    })
}

/// Eight signed byte scales at `at` as 32-bit lanes holding each scale twice (two i16), the
/// second operand of a `madd` that scales a lane's two 16-bit partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_twice_avx2(at: *const u8) -> __m256i {
    let wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i));
    let low = _mm256_and_si256(wide, _mm256_set1_epi32(0xFFFF));
    _mm256_or_si256(low, _mm256_slli_epi32::<16>(wide))
}

/// Super-block `src`'s scales for the eight lanes of half `half`, two sub-blocks per
/// register: lane `j` of entry `t` holds row `j`'s scales of sub-blocks `2t` and `2t + 1` as
/// two i16 (made once per super-block, not per panel row).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pairs_avx2(src: *const u8, half: usize) -> [__m256i; SUB_BLOCKS / 2] {
    byte_pairs_avx2(|s| {
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(
            src.add(SCALES + 16 * s + 8 * half) as *const __m128i
        ))
    })
}

/// Sub-block bytes of eight lanes (`byte(s)`: sub-block `s`'s, widened to 32 bits), two
/// sub-blocks per register as two i16: lane `j` of entry `t` holds sub-blocks `2t` and
/// `2t + 1`.
#[inline(always)]
unsafe fn byte_pairs_avx2(byte: impl Fn(usize) -> __m256i) -> [__m256i; SUB_BLOCKS / 2] {
    std::array::from_fn(|t| {
        _mm256_or_si256(
            _mm256_and_si256(byte(2 * t), _mm256_set1_epi32(0xFFFF)),
            _mm256_slli_epi32::<16>(byte(2 * t + 1)),
        )
    })
}

/// `Σ_s pair_s·bsum_s` of panel entry `i` in the lanes of `pairs` ([`byte_pairs_avx2`]), two
/// sub-blocks per `madd`: exact (|byte·bsum| ≤ 128·16·128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bsum_pairs_dot_avx2(
    job: &Q6KJob<'_>,
    pairs: &[__m256i; SUB_BLOCKS / 2],
    i: usize,
) -> __m256i {
    let bsums = job.a.bsums.get_unchecked(i).as_ptr();
    let mut total = _mm256_setzero_si256();
    for (t, pair) in pairs.iter().enumerate() {
        let a = _mm256_set1_epi32(bsums.add(2 * t).cast::<i32>().read_unaligned());
        total = _mm256_add_epi32(total, _mm256_madd_epi16(*pair, a));
    }
    total
}

/// The offset of a super-block's values for panel entry `i`, in the lanes of `pairs`
/// ([`scale_pairs_avx2`]): `−2^OFFSET_BITS·Σ_s scale_s·bsum_s`, two sub-blocks per `madd` (a
/// lane's scale pair against the entry's two activation sums; |scale·bsum| ≤ 128·16·128, far
/// from overflow).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offsets_avx2<V: SubBlockValues>(
    job: &Q6KJob<'_>,
    pairs: &[__m256i; SUB_BLOCKS / 2],
    i: usize,
) -> __m256i {
    let total = bsum_pairs_dot_avx2(job, pairs, i);
    let count = _mm_cvtsi32_si128(V::OFFSET_BITS as i32);
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sll_epi32(total, count))
}

/// Sub-block `s`'s Q6_K values of rows `8·half..8·half + 8` as bytes (as
/// [`q6k_values_avx512`], half the rows).
///
/// # Safety
/// The CPU must support AVX2; `src` is a Q6_K group's super-block.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q6k_values_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4] {
    let (low, top) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let at = |offset: usize| src.add(offset + 32 * half) as *const __m256i;
    let n0 = _mm256_loadu_si256(at(NIBBLES + 128 * s));
    let n1 = _mm256_loadu_si256(at(NIBBLES + 128 * s + 64));
    let h = _mm256_loadu_si256(at(HIGH + 64 * s));
    [
        _mm256_or_si256(
            _mm256_and_si256(n0, low),
            _mm256_and_si256(_mm256_slli_epi16::<4>(h), top),
        ),
        _mm256_or_si256(
            _mm256_and_si256(n1, low),
            _mm256_and_si256(_mm256_slli_epi16::<2>(h), top),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(n0), low),
            _mm256_and_si256(h, top),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(n1), low),
            _mm256_and_si256(_mm256_srli_epi16::<2>(h), top),
        ),
    ]
}

/// Stages a group for the scaled-products tile kernel
/// ([`run_scaled`](super::super::scaled_tiles_x86::run_scaled)): per super-block, sub-block
/// `s`'s values `4t..4t + 4` of the sixteen rows (`q = u − 2^OFFSET_BITS`) times the rows'
/// scales of `s`, in [`SubBlockValues::STAGED_TILES`] parts, as the super-block's `K`-row
/// `4s + t`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn stage_scaled_values<V: SubBlockValues>(
    group: &[u8],
    nb: usize,
    blocks: Range<usize>,
    staged: &mut [u8],
) {
    let block_bytes = scaled_staged_bytes(V::STAGED_TILES);
    assert!(group.len() >= nb * V::GROUP_BLOCK_BYTES && blocks.end <= nb);
    assert!(staged.len() >= blocks.len() * block_bytes);
    let bias = _mm512_set1_epi8(1 << V::OFFSET_BITS);
    for (i, b) in blocks.enumerate() {
        let src = group.as_ptr().add(b * V::GROUP_BLOCK_BYTES);
        let dst = staged.as_mut_ptr().add(i * block_bytes);
        for s in 0..SUB_BLOCKS {
            let scales = scales_in_both_halves(src.add(SCALES + 16 * s));
            for (t, u) in V::values_avx512(src, s).into_iter().enumerate() {
                let q = _mm512_sub_epi8(u, bias);
                match V::STAGED_TILES {
                    1 => stage_row::<1>(dst, 4 * s + t, q, scales),
                    _ => stage_row::<2>(dst, 4 * s + t, q, scales),
                }
            }
        }
    }
}

/// The staged kernel's float step per super-block: the AVX-512 path's
/// ([`accumulate_super_block`], then [`accumulate_mins_avx512`] into the second accumulators
/// where the format has mins).
///
/// # Safety
/// As [`group_avx512`]; `src` is super-block `b` of the job's group.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn float_step<V: SubBlockValues>(
    job: &Q6KJob<'_>,
    src: *const u8,
    b: usize,
    sums: &[__m512i; PANEL],
    [acc, acc_min]: &mut [[__m512; PANEL]; 2],
) {
    accumulate_super_block(job, src, b, sums, acc);
    if let Some(at) = V::MINS {
        accumulate_mins_avx512(job, src.add(at), b, acc_min);
    }
}
