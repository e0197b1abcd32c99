//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's sub-block sums form in its own lane; the same exact integers and the same float
//! operations per output as [`super::group_portable`].

use super::super::tiles::{TileConfig, Tiles};
use super::{GroupOut, Q6KJob, GROUP, GROUP_BLOCK_BYTES, HIGH, NIBBLES, SCALES, SUB_BLOCKS};
use crate::model::kernels::kquant::QK_K;
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;

/// Four activation bytes of panel entry `i` (super-block and row), from byte `at`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn activation_word(job: &Q6KJob<'_>, i: usize, at: usize) -> i32 {
    (job.a.qs.as_ptr().add(i) as *const u8)
        .add(at)
        .cast::<i32>()
        .read_unaligned()
}

/// The start of sub-block `s`'s sum for panel entry `i`: the −32 offset of the values through
/// the activation sum (|32·bsum| ≤ 32·16·127, far from overflow with the products added).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset(job: &Q6KJob<'_>, i: usize, s: usize) -> i32 {
    -32 * *job.a.bsums.get_unchecked(i).get_unchecked(s) as i32
}

/// Every sub-block's [`offset`] of super-block `b` for the panel's rows, `[row][sub-block]`:
/// made once per super-block in vector registers, so that the sub-block loop starts each sum
/// with a broadcast from memory (a load, not a vector-port operation and three scalar ones).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sub_block_offsets(job: &Q6KJob<'_>, b: usize) -> [[i32; SUB_BLOCKS]; PANEL] {
    let mut offsets = [[0i32; SUB_BLOCKS]; PANEL];
    for (r, o) in offsets.iter_mut().enumerate() {
        let bsums = job.a.bsums.get_unchecked(b * PANEL + r);
        let wide = _mm512_cvtepi16_epi32(_mm256_loadu_si256(bsums.as_ptr() as *const __m256i));
        let minus_32 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<5>(wide));
        _mm512_storeu_si512(o.as_mut_ptr() as *mut _, minus_32);
    }
    offsets
}

/// Sub-block `s`'s sixteen rows of 6-bit values as bytes: register `t` holds values
/// `16s + 4t..16s + 4t + 4` of every row (lane `j`: row `j`); 16-bit shifts, whatever crosses
/// a byte boundary is masked off.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sub_block_values(src: *const u8, s: usize) -> [__m512i; 4] {
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
pub(super) unsafe fn group_avx512(job: &Q6KJob<'_>) -> GroupOut {
    let mut acc = [_mm512_setzero_ps(); PANEL];
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * GROUP_BLOCK_BYTES);
        let mut sums = [_mm512_setzero_si512(); PANEL];
        let offsets = sub_block_offsets(job, b);
        for s in 0..SUB_BLOCKS {
            let w = sub_block_values(src, s);
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
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i));
        for (r, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
            let da = _mm512_set1_ps(*job.a.d.get_unchecked(b * PANEL + r));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(*sum), *acc);
        }
    }
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass; `maddubs` + `madd` form each lane's four products per step (no saturation: pairs of
/// a 6-bit value times an activation stay below 2¹⁵).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2(job: &Q6KJob<'_>) -> GroupOut {
    const ROWS: usize = 4;
    let low = _mm256_set1_epi8(0x0F);
    let top = _mm256_set1_epi8(0x30);
    let ones = _mm256_set1_epi16(1);
    let mut out = [[0f32; GROUP]; PANEL];
    for half in 0..2 {
        for r0 in (0..PANEL).step_by(ROWS) {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..job.nb {
                let src = job.group.as_ptr().add(b * GROUP_BLOCK_BYTES);
                let mut sums = [_mm256_setzero_si256(); ROWS];
                for s in 0..SUB_BLOCKS {
                    let at = |offset: usize| src.add(offset + 32 * half) as *const __m256i;
                    let n0 = _mm256_loadu_si256(at(NIBBLES + 128 * s));
                    let n1 = _mm256_loadu_si256(at(NIBBLES + 128 * s + 64));
                    let h = _mm256_loadu_si256(at(HIGH + 64 * s));
                    let w = [
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
                    ];
                    let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        src.add(SCALES + 16 * s + 8 * half) as *const __m128i,
                    ));
                    for (dr, sum) in sums.iter_mut().enumerate() {
                        let i = b * PANEL + r0 + dr;
                        let mut t = _mm256_set1_epi32(offset(job, i, s));
                        for (step, w) in w.iter().enumerate() {
                            let a = _mm256_set1_epi32(activation_word(job, i, 16 * s + 4 * step));
                            let pairs = _mm256_maddubs_epi16(*w, a);
                            t = _mm256_add_epi32(t, _mm256_madd_epi16(pairs, ones));
                        }
                        *sum = _mm256_add_epi32(*sum, _mm256_mullo_epi32(t, scale));
                    }
                }
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(src.add(16 * half) as *const __m128i));
                for (dr, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
                    let da = _mm256_set1_ps(*job.a.d.get_unchecked(b * PANEL + r0 + dr));
                    *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(*sum), *acc);
                }
            }
            super::super::shared_x86::store_half(&mut out, half, r0, &acc);
        }
    }
    out
}

/// Tiles: `C` (tmm0) one sub-block's integer sums, 8 panel rows × 16 weight rows (i32); `A`
/// (tmm4) the panel's 16 activations of the sub-block (rows 256 bytes apart); `B` (tmm6) the
/// sub-block's 6-bit values as bytes, 4 rows (four values each) × 16 weight rows.
const TILES: TileConfig = TileConfig::new([
    (PANEL as u8, 64),
    (0, 0),
    (0, 0),
    (0, 0),
    (PANEL as u8, 16),
    (0, 0),
    (4, 64),
    (0, 0),
]);

/// Per super-block, the values unpacked to bytes as [`group_avx512`] forms them (sub-block
/// `s` as four 64-byte rows), then per sub-block one `tdpbsud` (signed activations × unsigned
/// 6-bit values) and, in AVX-512, the −32 offset and the rows' scales; the float step is the
/// AVX-512 path's.
///
/// # Safety
/// As [`group_avx512`], and `tiles` must be usable (see [`Tiles`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_amx<T: Tiles>(tiles: &mut T, job: &Q6KJob<'_>) -> GroupOut {
    let mut acc = [_mm512_setzero_ps(); PANEL];
    let mut weights = [0u8; SUB_BLOCKS * 4 * 64];
    let mut dots = [[0i32; 16]; PANEL];
    tiles.configure(&TILES);
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * GROUP_BLOCK_BYTES);
        for s in 0..SUB_BLOCKS {
            for (t, w) in sub_block_values(src, s).iter().enumerate() {
                _mm512_storeu_si512(weights.as_mut_ptr().add(256 * s + 64 * t) as *mut _, *w);
            }
        }
        let activations = job.a.qs.as_ptr().add(b * PANEL) as *const u8;
        let mut sums = [_mm512_setzero_si512(); PANEL];
        let offsets = sub_block_offsets(job, b);
        for s in 0..SUB_BLOCKS {
            tiles.zero(0);
            tiles.load(4, activations.add(16 * s), QK_K);
            tiles.load(6, weights.as_ptr().add(256 * s), 64);
            tiles.dp_su(0, 4, 6);
            tiles.store(0, dots.as_mut_ptr() as *mut u8, 64);
            let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(src.add(SCALES + 16 * s) as *const _));
            for (r, (sum, dot)) in sums.iter_mut().zip(&dots).enumerate() {
                let t = _mm512_add_epi32(
                    _mm512_loadu_si512(dot.as_ptr() as *const _),
                    _mm512_set1_epi32(*offsets.get_unchecked(r).get_unchecked(s)),
                );
                *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(t, scale));
            }
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i));
        for (r, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
            let da = _mm512_set1_ps(*job.a.d.get_unchecked(b * PANEL + r));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(*sum), *acc);
        }
    }
    tiles.release();
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}
