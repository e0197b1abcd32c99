//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's whole-block integer sum forms in its own lane; the same exact integers and the
//! same float operations per output as [`super::portable`]. `MIN` selects Q5_1's layout
//! (minima after the scales) and its minima's step.

use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::super::tiles::{self, TileConfig, Tiles};
use super::{block_bytes, values_at, GroupOut, Int8Job};
use crate::model::kernels::panel::{BLOCK, PANEL};
use std::arch::x86_64::*;

/// Four activation bytes of block `i`, from byte `4·t`, in every 32-bit lane: they meet
/// weight values `4t..4t + 4` (run `t`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn activation_word(job: &Int8Job<'_>, i: usize, t: usize) -> i32 {
    (job.a.qs.as_ptr().add(i) as *const u8)
        .add(4 * t)
        .cast::<i32>()
        .read_unaligned()
}

/// Sixteen weight rows per 512-bit register; VNNI forms each lane's four products per run,
/// `(q_w + 128)·q_a`, from a start of `−128·Σq_a`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
/// checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_avx512<const MIN: bool>(job: &Int8Job<'_>) -> GroupOut {
    let bias = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); PANEL];
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * block_bytes::<MIN>());
        let scales = shared::scales::<MIN>(src);
        let mut w = [_mm512_setzero_si512(); 8];
        for (t, w) in w.iter_mut().enumerate() {
            let raw = _mm512_loadu_si512(src.add(values_at::<MIN>() + 64 * t) as *const _);
            *w = _mm512_xor_si512(raw, bias);
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let i = b * PANEL + r;
            let mut s = _mm512_set1_epi32(-128 * *job.a.sums.get_unchecked(i));
            for (t, w) in w.iter().enumerate() {
                let a = _mm512_set1_epi32(activation_word(job, i, t));
                s = _mm512_dpbusd_epi32(s, *w, a);
            }
            *acc_r = shared::block_step::<MIN>(job, i, scales, s, *acc_r);
        }
    }
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}

/// Q8_0's values (−128..127): eight weight rows per 256-bit register (the group in two
/// halves), four panel rows per pass; `maddubs` + `madd` form each lane's four products per
/// run as `|q_w|` times `q_a` with `q_w`'s sign (a pair is at most 2·128·127 = 32512, so no
/// saturation, but two pairs may exceed 2¹⁵: each run is widened on its own). The run is the
/// outer loop, so its weights are loaded and their magnitudes made once for the pass's rows
/// and every sum stays in a register (block-outer, the sixteen weight registers spilled).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2_signed(job: &Int8Job<'_>) -> GroupOut {
    let ones = _mm256_set1_epi16(1);
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * block_bytes::<false>());
            let mut sums = [_mm256_setzero_si256(); ROWS];
            for t in 0..8 {
                let at = values_at::<false>() + 64 * t + 32 * half;
                let w = _mm256_loadu_si256(src.add(at) as *const __m256i);
                let abs = _mm256_sign_epi8(w, w);
                for (dr, s) in sums.iter_mut().enumerate() {
                    let a = _mm256_set1_epi32(activation_word(job, b * PANEL + r0 + dr, t));
                    let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(a, w));
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pairs, ones));
                }
            }
            let scales = shared::scales_avx2::<false>(src, half);
            for (dr, (acc, s)) in acc.iter_mut().zip(sums).enumerate() {
                *acc = shared::block_step_avx2::<false>(job, b * PANEL + r0 + dr, scales, s, *acc);
            }
        }
        acc
    })
}

/// Q5_0's values (−16..15, `MIN` false) and Q5_1's (0..31, `MIN`): multiplied as unsigned
/// bytes 0..31 (Q5_0's plus 16, its sum started from `−16·Σq_a`), so `maddubs` takes them
/// as they are, without Q8_0's sign steps; four runs are added in 16 bits before one `madd`
/// widens them — exact, since a pair is at most 2·31·128 = 7936 and four 31744 < 2¹⁵. Eight
/// weight rows per register, four panel rows per pass, the run the outer loop.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2_five_bit<const MIN: bool>(job: &Int8Job<'_>) -> GroupOut {
    const RUNS_IN_16_BITS: usize = 4;
    let bias = _mm256_set1_epi8(if MIN { 0 } else { 16 });
    let ones = _mm256_set1_epi16(1);
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * block_bytes::<MIN>());
            let mut sums: [__m256i; ROWS] = std::array::from_fn(|dr| {
                let i = b * PANEL + r0 + dr;
                _mm256_set1_epi32(if MIN {
                    0
                } else {
                    -16 * *job.a.sums.get_unchecked(i)
                })
            });
            for t0 in (0..8).step_by(RUNS_IN_16_BITS) {
                let mut pairs = [_mm256_setzero_si256(); ROWS];
                for t in t0..t0 + RUNS_IN_16_BITS {
                    let at = values_at::<MIN>() + 64 * t + 32 * half;
                    let raw = _mm256_loadu_si256(src.add(at) as *const __m256i);
                    let w = _mm256_add_epi8(raw, bias);
                    for (dr, p) in pairs.iter_mut().enumerate() {
                        let a = _mm256_set1_epi32(activation_word(job, b * PANEL + r0 + dr, t));
                        *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(w, a));
                    }
                }
                for (s, p) in sums.iter_mut().zip(pairs) {
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, ones));
                }
            }
            let scales = shared::scales_avx2::<MIN>(src, half);
            for (dr, (acc, s)) in acc.iter_mut().zip(sums).enumerate() {
                *acc = shared::block_step_avx2::<MIN>(job, b * PANEL + r0 + dr, scales, s, *acc);
            }
        }
        acc
    })
}

/// Tiles ([`tiles::pipelined_config`]): `C` the integer sums, 8 panel rows × 16 weight rows
/// (i32); `A` the panel's block, 8 rows × 32 bytes; `B` the block's eight runs as stored (run
/// `t`: values `4t..4t + 4` of each weight row, which is the tile's layout).
const TILES: TileConfig = tiles::pipelined_config(BLOCK as u16);

/// Per block, one `tdpbssd` forms all 8 × 16 sums `Σ q_w·q_a` straight from the group's
/// runs, the tile unit working ahead ([`tiles::pipelined`]); then, per panel row, the AVX-512
/// path's float operations on the same integers.
///
/// # Safety
/// As [`group_avx512`], and `tiles` must be usable (see [`Tiles`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_amx<T: Tiles, const MIN: bool>(
    tiles: &mut T,
    job: &Int8Job<'_>,
) -> GroupOut {
    let mut acc = [_mm512_setzero_ps(); PANEL];
    let block = |b: usize| job.group.as_ptr().add(b * block_bytes::<MIN>());
    tiles.configure(&TILES);
    tiles::pipelined(
        tiles,
        job.nb,
        |tiles, b, t| {
            tiles.zero(t.c);
            tiles.load(t.a, job.a.qs.as_ptr().add(b * PANEL) as *const u8, BLOCK);
            tiles.load(t.b, block(b).add(values_at::<MIN>()), 64);
            tiles.dp_ss(t.c, t.a, t.b);
        },
        |b, sums| {
            let scales = shared::scales::<MIN>(block(b));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let s = _mm512_loadu_si512(sums[r].as_ptr() as *const _);
                *acc_r = shared::block_step::<MIN>(job, b * PANEL + r, scales, s, *acc_r);
            }
        },
    );
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}
