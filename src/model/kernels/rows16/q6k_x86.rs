//! The x86 micro-kernels of [`super`], generic over the values' layout
//! ([`SubBlockValues`]): one 32-bit lane per weight row of the group, so each output's
//! sub-block sums form in its own lane; the same exact integers and the same float operations
//! per output as the portable kernel. Q6_K's values are unpacked here too
//! ([`q6k_values_avx2`], [`q6k_values_avx512`]).

use super::super::shared_x86::q8k_word as activation_word;
use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::super::shared_x86::{assert_pairs, load_acc, pair_block, store_acc};
use super::super::shared_x86::{pipeline_units, PairSums, FULL_TILES, STAGED_TILE};
use super::super::tiles::Tiles;
use super::super::{StagedAcc, StagedJob};
use super::{GroupOut, Q6KJob, SubBlockValues, HIGH, NIBBLES, SCALES, STAGED_BYTES, SUB_BLOCKS};
use crate::model::kernels::kquant::q8k::Q8KPanel;
use crate::model::kernels::kquant::QK_K;
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
unsafe fn accumulate_mins_avx512(
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

/// Super-block `b`'s (at `src`) float step on `sums` (the exact scaled integer sums per panel
/// row): `acc = fma(d_w·d_a, sum, acc)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn accumulate_super_block(
    job: &Q6KJob<'_>,
    src: *const u8,
    b: usize,
    sums: &[__m512i; PANEL],
    acc: &mut [__m512; PANEL],
) {
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i));
    for (r, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
        let da = _mm512_set1_ps(*job.a.d.get_unchecked(b * PANEL + r));
        *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(*sum), *acc);
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

/// Base of the scales' digits in the staged layout: `scale = d₀ + 7·d₁ + 49·d₂` with each
/// digit in −3..=3 (balanced base 7 reaches ±171, every i8), so a digit times a value `q`
/// (Q6_K's −32..=31, Q3_K's −4..=3) is at most 96 in magnitude: a signed byte.
const DIGIT_BASE: i32 = 7;

/// The three balanced base-7 digits of sixteen i8 scales (at `src`), each digit in both 16-bit
/// halves of its scale's 32-bit lane. With `x = scale + 171` (0 ..= 298: 171 is 24·7 + 3),
/// `x mod 7 − 3` is the lowest balanced digit and `⌊x / 7⌋` the rest plus 24 (3·7 + 3), and so
/// on; `⌊x / 7⌋ = (x · 9363) >> 16` for every `x` below 400.
///
/// # Safety
/// The CPU must support AVX-512F; `src` holds sixteen bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn scale_digits(src: *const u8) -> [__m512i; 3] {
    let seven = _mm512_set1_epi32(DIGIT_BASE);
    let three = _mm512_set1_epi32(3);
    let by_seven =
        |x: __m512i| _mm512_srli_epi32::<16>(_mm512_mullo_epi32(x, _mm512_set1_epi32(9363)));
    let x = _mm512_add_epi32(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(src as *const _)),
        _mm512_set1_epi32(171),
    );
    let x1 = by_seven(x);
    let x2 = by_seven(x1);
    let digit = |x: __m512i, q: __m512i| {
        _mm512_sub_epi32(_mm512_sub_epi32(x, _mm512_mullo_epi32(q, seven)), three)
    };
    let in_both_halves = |d: __m512i| {
        _mm512_or_si512(
            _mm512_and_si512(d, _mm512_set1_epi32(0xFFFF)),
            _mm512_slli_epi32::<16>(d),
        )
    };
    [digit(x, x1), digit(x1, x2), _mm512_sub_epi32(x2, three)].map(in_both_halves)
}

/// Stages a group for [`run_amx`]: per super-block and 64-value chunk `c` (sub-blocks
/// `4c..4c + 4`), three tiles, the values `q` times digit `i` of their sub-block's scale
/// ([`scale_digits`]), as signed bytes; row `4h + t` of a tile holds values `4t..4t + 4` of
/// sub-block `4c + h` of each weight row (bytes `4j..4j + 4`: row `j`), the tile's layout.
/// The products are formed per 16-bit lane on the sign-extended even and odd bytes.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn stage_scale_digits<V: SubBlockValues>(
    group: &[u8],
    nb: usize,
    blocks: Range<usize>,
    staged: &mut [u8],
) {
    assert!(group.len() >= nb * V::GROUP_BLOCK_BYTES && blocks.end <= nb);
    assert!(staged.len() >= blocks.len() * STAGED_BYTES);
    let bias = _mm512_set1_epi8(1 << V::OFFSET_BITS);
    let low_byte = _mm512_set1_epi16(0x00FF);
    for (i, b) in blocks.enumerate() {
        let src = group.as_ptr().add(b * V::GROUP_BLOCK_BYTES);
        for s in 0..SUB_BLOCKS {
            let digits = scale_digits(src.add(SCALES + 16 * s));
            let tiles = staged
                .as_mut_ptr()
                .add(i * STAGED_BYTES + (s / 4) * 3 * STAGED_TILE);
            for (t, q) in V::values_avx512(src, s).into_iter().enumerate() {
                let v = _mm512_sub_epi8(q, bias);
                let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(v));
                let odd = _mm512_srai_epi16::<8>(v);
                let row = 64 * (4 * (s % 4) + t);
                for (digit, d) in digits.iter().enumerate() {
                    let lo = _mm512_and_si512(_mm512_mullo_epi16(even, *d), low_byte);
                    let hi = _mm512_slli_epi16::<8>(_mm512_mullo_epi16(odd, *d));
                    let dst = tiles.add(digit * STAGED_TILE + row);
                    _mm512_storeu_si512(dst as *mut _, _mm512_or_si512(lo, hi));
                }
            }
        }
    }
}

/// A run of panels against a staged group ([`stage_scale_digits`]) and their staged
/// activations ([`stage_pairs`](super::super::shared_x86::stage_pairs)): super-block by
/// super-block (its staged 12 KiB stay in L1 while every pair of the run passes), per pair of
/// panels, four chunks of 64 values, each one `A` load, three `B` loads and three full
/// 16 × 64 × 16 `tdpbssd`, so the three digit sums of the whole super-block form in the tiles
/// and leave them once; `d₀ + 7·d₁ + 49·d₂` is then the AVX-512 path's exact
/// `Σ_s scale_s·Σ_e q_e·a_e`, and the float step is its own. Each unit's vector work is
/// issued after the next unit's tile products.
///
/// # Safety
/// As [`group_avx512`], `tiles` must be usable (see [`Tiles`]) and `job.staged` and
/// `job.pairs` written for this job.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run_amx<T: Tiles, V: SubBlockValues>(
    tiles: &mut T,
    job: &StagedJob<'_, Q8KPanel<'_>>,
    accumulators: &mut [StagedAcc],
) {
    let pairs = job.panels.len().div_ceil(2);
    assert!(job.blocks.end <= job.nb && job.staged.len() >= job.blocks.len() * STAGED_BYTES);
    assert_pairs(job);
    assert!(accumulators.len() >= job.panels.len());
    let mut acc: Vec<[__m512; PANEL]> = accumulators[..job.panels.len()]
        .iter()
        .map(|a| load_acc(a)[0])
        .collect();
    let activations_of = |b: usize, q: usize| pair_block(job, b, q);
    // The tiles (all 16 rows of 64 bytes): `C` tmm0–tmm2, the sums of the three scale
    // digits, 16 activation rows (a panel pair) × 16 weight rows (i32); `A` tmm4–tmm5 by chunk
    // parity, a chunk's 64 activations of the 16 rows; `B` tmm6, tmm7, tmm3, the chunk's staged
    // values times each digit.
    let multiply = |tiles: &mut T, b: usize, q: usize| {
        let staged = job
            .staged
            .as_ptr()
            .add((b - job.blocks.start) * STAGED_BYTES);
        let activations = activations_of(b, q);
        for c in 0..3 {
            tiles.zero(c);
        }
        for c in 0..QK_K / 64 {
            let a = if c % 2 == 0 { 4 } else { 5 };
            let chunk = staged.add(3 * c * STAGED_TILE);
            tiles.load(a, activations.add(64 * c), QK_K);
            tiles.load(6, chunk, 64);
            tiles.load(7, chunk.add(STAGED_TILE), 64);
            tiles.load(3, chunk.add(2 * STAGED_TILE), 64);
            tiles.dp_ss(0, a, 6);
            tiles.dp_ss(1, a, 7);
            tiles.dp_ss(2, a, 3);
        }
    };
    let consume = |b: usize, q: usize, [d0, d1, d2]: &[PairSums; 3]| {
        let src = job.group.as_ptr().add(b * V::GROUP_BLOCK_BYTES);
        let pair = 2 * q..(2 * q + 2).min(job.panels.len());
        let (seven, forty_nine) = (_mm512_set1_epi32(DIGIT_BASE), _mm512_set1_epi32(49));
        for (half, (&a, acc)) in job.panels[pair.clone()]
            .iter()
            .zip(&mut acc[pair])
            .enumerate()
        {
            let sums: [__m512i; PANEL] = std::array::from_fn(|r| {
                let at =
                    |d: &PairSums| _mm512_loadu_si512(d[PANEL * half + r].as_ptr() as *const _);
                let upper = _mm512_add_epi32(
                    _mm512_mullo_epi32(at(d1), seven),
                    _mm512_mullo_epi32(at(d2), forty_nine),
                );
                _mm512_add_epi32(at(d0), upper)
            });
            let job = Q6KJob {
                group: job.group,
                nb: job.nb,
                a,
            };
            accumulate_super_block(&job, src, b, &sums, acc);
        }
    };
    tiles.configure(&FULL_TILES);
    pipeline_units(
        tiles,
        (job.blocks.clone(), pairs),
        multiply,
        |b, q| [activations_of(b, q)],
        consume,
    );
    // Only the first half: these formats have no minima.
    let unused = [_mm512_setzero_ps(); PANEL];
    for (sums, acc) in acc.iter().zip(accumulators) {
        store_acc(&[*sums, unused], acc);
    }
}

/// A panel's outputs from [`run_amx`]'s accumulators after the last slice.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn staged_outputs(acc: &StagedAcc) -> GroupOut {
    crate::model::kernels::avx512::lanes_to_outputs(&load_acc(acc)[0])
}
