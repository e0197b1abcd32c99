//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's scaled sub-block sums form in its own lane; the same exact integer per
//! super-block and the same float operation per output as [`super::Iq4Xs`]'s portable
//! definition.

use super::super::q4::IQ4_NL_BYTES;
use super::super::scaled_tiles_x86::{accumulate_super_block, scales_in_both_halves, stage_row};
use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::super::shared_x86::{q8k_word as activation_word, sub_block_sum_pair};
use super::super::{scaled_staged_bytes, Format};
use super::{GroupOut, Iq4Xs, XsJob, INDICES, IQ4_NL_VALUES, SCALES, SUB_BLOCKS, SUB_BLOCK_BYTES};
use crate::model::kernels::kquant::q8k::SUB_BLOCK_PAIRS;
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;

/// Activation byte where step `step` of a sub-block's products starts: steps 0..4 meet the
/// runs' low nibbles (values `4t..4t + 4`), steps 4..8 their high ones (`16 + 4t..`).
#[inline(always)]
fn step_offset(step: usize) -> usize {
    4 * (step % 4) + 16 * (step / 4)
}

/// Sixteen weight rows per 512-bit register; each index looked up as `table + 128`, VNNI
/// forms each lane's four products per step, `vpdpwssd` two sub-blocks' `scale·Σq_a` per step
/// for the `−128·` correction.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
/// checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_avx512(job: &XsJob<'_>) -> GroupOut {
    let low = _mm512_set1_epi8(0x0F);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_NL_BYTES.as_ptr() as *const __m128i));
    let mut acc = [_mm512_setzero_ps(); PANEL];
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * Iq4Xs::GROUP_BLOCK_BYTES);
        let mut sums = [_mm512_setzero_si512(); PANEL];
        let scale =
            |s: usize| _mm512_cvtepi8_epi32(_mm_loadu_si128(src.add(SCALES + 16 * s) as *const _));
        for s in 0..SUB_BLOCKS {
            let w: [__m512i; 8] = std::array::from_fn(|step| {
                let at = INDICES + SUB_BLOCK_BYTES * s + 64 * (step % 4);
                let raw = _mm512_loadu_si512(src.add(at) as *const _);
                let nibbles = if step < 4 {
                    _mm512_and_si512(raw, low)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low)
                };
                _mm512_shuffle_epi8(table, nibbles)
            });
            let scale = scale(s);
            for (r, sum) in sums.iter_mut().enumerate() {
                let i = b * PANEL + r;
                let mut t = _mm512_setzero_si512();
                for (step, w) in w.iter().enumerate() {
                    let a = _mm512_set1_epi32(activation_word(job, i, 32 * s + step_offset(step)));
                    t = _mm512_dpbusd_epi32(t, *w, a);
                }
                *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(t, scale));
            }
        }
        // Σ_s scale_s·Σq_a over the sub-blocks, two per step: each lane's low i16 the even
        // sub-block's scale, its high one the odd one's.
        let mut offsets = [_mm512_setzero_si512(); PANEL];
        for t in 0..SUB_BLOCK_PAIRS {
            let even = _mm512_and_si512(scale(2 * t), _mm512_set1_epi32(0xFFFF));
            let pair = _mm512_or_si512(even, _mm512_slli_epi32::<16>(scale(2 * t + 1)));
            for (r, offset) in offsets.iter_mut().enumerate() {
                let a = _mm512_set1_epi32(sub_block_sum_pair(job, b, t, r));
                *offset = _mm512_dpwssd_epi32(*offset, pair, a);
            }
        }
        let sums: [__m512i; PANEL] =
            std::array::from_fn(|r| _mm512_sub_epi32(sums[r], _mm512_slli_epi32::<7>(offsets[r])));
        accumulate_super_block(job, src, b, &sums, &mut acc);
    }
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass; each index looked up as its signed table value, `|value|` times `q_a` with the
/// value's sign ([`shared::signed_table_step_avx2`]), then one `mullo` per sub-block applies
/// its scale.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2(job: &XsJob<'_>) -> GroupOut {
    let table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_NL_VALUES.as_ptr() as *const __m128i));
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * Iq4Xs::GROUP_BLOCK_BYTES);
            let mut sums = [_mm256_setzero_si256(); ROWS];
            for s in 0..SUB_BLOCKS {
                let mut dots = [_mm256_setzero_si256(); ROWS];
                for t in 0..4 {
                    let at = INDICES + SUB_BLOCK_BYTES * s + 64 * t + 32 * half;
                    let raw = _mm256_loadu_si256(src.add(at) as *const __m256i);
                    let word = |h: usize, dr: usize| {
                        let at = 32 * s + step_offset(t + 4 * h);
                        activation_word(job, b * PANEL + r0 + dr, at)
                    };
                    shared::signed_table_step_avx2(raw, table, word, &mut dots);
                }
                let at = SCALES + 16 * s + 8 * half;
                let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(src.add(at) as *const __m128i));
                for (sum, dot) in sums.iter_mut().zip(dots) {
                    *sum = _mm256_add_epi32(*sum, _mm256_mullo_epi32(dot, scale));
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(src.add(16 * half) as *const __m128i));
            for (dr, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let da = _mm256_set1_ps(*job.a.d.get_unchecked(b * PANEL + r0 + dr));
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sum), *acc);
            }
        }
        acc
    })
}

/// Stages a group for the scaled-products tile kernel
/// ([`run_scaled`](super::super::scaled_tiles_x86::run_scaled), two parts): per super-block,
/// sub-block `s`'s values `4·step..4·step + 4` of the sixteen rows (the signed table values,
/// `vpshufb`) times the rows' scales `ls − 32` of `s`, as the super-block's `K`-row
/// `8s + step`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn stage_scaled_values(
    group: &[u8],
    nb: usize,
    blocks: std::ops::Range<usize>,
    staged: &mut [u8],
) {
    let block_bytes = scaled_staged_bytes(2);
    assert!(group.len() >= nb * Iq4Xs::GROUP_BLOCK_BYTES && blocks.end <= nb);
    assert!(staged.len() >= blocks.len() * block_bytes);
    let low = _mm512_set1_epi8(0x0F);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_NL_VALUES.as_ptr() as *const __m128i));
    for (i, b) in blocks.enumerate() {
        let src = group.as_ptr().add(b * Iq4Xs::GROUP_BLOCK_BYTES);
        let dst = staged.as_mut_ptr().add(i * block_bytes);
        for s in 0..SUB_BLOCKS {
            let scales = scales_in_both_halves(src.add(SCALES + 16 * s));
            for t in 0..4 {
                let at = INDICES + SUB_BLOCK_BYTES * s + 64 * t;
                let raw = _mm512_loadu_si512(src.add(at) as *const _);
                // Run `t`'s low nibbles are values `4t..4t + 4`, its high ones `16 + 4t..`.
                let nibbles = [
                    _mm512_and_si512(raw, low),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low),
                ];
                for (h, nibbles) in nibbles.into_iter().enumerate() {
                    let q = _mm512_shuffle_epi8(table, nibbles);
                    stage_row::<2>(dst, 8 * s + 4 * h + t, q, scales);
                }
            }
        }
    }
}

/// The staged kernel's float step per super-block: the AVX-512 path's
/// ([`accumulate_super_block`]).
///
/// # Safety
/// As [`group_avx512`]; `src` is super-block `b` of the job's group.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn float_step(
    job: &XsJob<'_>,
    src: *const u8,
    b: usize,
    sums: &[__m512i; PANEL],
    [acc, _]: &mut [[__m512; PANEL]; 2],
) {
    accumulate_super_block(job, src, b, sums, acc);
}
