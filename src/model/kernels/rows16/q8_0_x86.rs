//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's whole-block integer sum forms in its own lane; the same exact integers and the
//! same float operations per output as [`super::portable`]. `MIN` selects Q5_1's layout
//! (minima after the scales) and its minima's step.

use super::super::shared_x86 as shared;
use super::super::tiles::{self, TileConfig, Tiles};
use super::{block_bytes, values_at, GroupOut, Int8Job, GROUP};
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

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass; `maddubs` + `madd` form each lane's four products per run as `|q_w|` times `q_a`
/// with `q_w`'s sign (no saturation: pairs stay below 2¹⁵).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2<const MIN: bool>(job: &Int8Job<'_>) -> GroupOut {
    const ROWS: usize = 4;
    let ones = _mm256_set1_epi16(1);
    let mut out = [[0f32; GROUP]; PANEL];
    for half in 0..2 {
        for r0 in (0..PANEL).step_by(ROWS) {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..job.nb {
                let src = job.group.as_ptr().add(b * block_bytes::<MIN>());
                let scales = shared::scales_avx2::<MIN>(src, half);
                let mut w = [_mm256_setzero_si256(); 8];
                let mut abs = [_mm256_setzero_si256(); 8];
                for t in 0..8 {
                    let at = values_at::<MIN>() + 64 * t + 32 * half;
                    w[t] = _mm256_loadu_si256(src.add(at) as *const __m256i);
                    abs[t] = _mm256_sign_epi8(w[t], w[t]);
                }
                for (dr, acc_r) in acc.iter_mut().enumerate() {
                    let i = b * PANEL + r0 + dr;
                    let mut s = _mm256_setzero_si256();
                    for t in 0..8 {
                        let a = _mm256_set1_epi32(activation_word(job, i, t));
                        let pairs = _mm256_maddubs_epi16(abs[t], _mm256_sign_epi8(a, w[t]));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(pairs, ones));
                    }
                    *acc_r = shared::block_step_avx2::<MIN>(job, i, scales, s, *acc_r);
                }
            }
            shared::store_half(&mut out, half, r0, &acc);
        }
    }
    out
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
