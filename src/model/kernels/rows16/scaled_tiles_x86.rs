//! The staged tile kernel of the formats whose sub-blocks carry small integer scales over
//! signed values (Q6_K, Q3_K, Q2_K of [`super::q6k`]; IQ4_XS): each value times its
//! sub-block's scale, `p = q·scale`, is staged as one signed byte where every such product is
//! one (Q2_K), else as two, `p = l + 128·h` ([`scaled_bytes`]); the tiles then form a
//! super-block's `Σ_s scale_s·Σ_e q_e·a_e` exactly (one or two full 16 × 64 × 16 `tdpbssd`
//! per 64 values), which meets the AVX-512 path's float step, so every level gives the same
//! bits. (Q4_K and Q5_K split their scales instead, `8·high + low`, as unsigned bytes:
//! [`super::q4k`].)
//!
//! Why products, not scale digits: this kernel staged each Q6_K value times each of its
//! scale's three balanced base-7 digits (three tiles per chunk, three products and three `B`
//! loads); splitting the product needs two, since `|q·scale| ≤ 4096` leaves `h` a byte.

use super::shared_x86::{assert_pairs, load_acc, pair_block, store_acc, Q8KJob};
use super::shared_x86::{pipeline_units, PairSums, FULL_TILES, STAGED_TILE};
use super::tiles::Tiles;
use super::{scaled_staged_bytes, GroupOut, StagedAcc, StagedJob};
use crate::model::kernels::kquant::q8k::Q8KPanel;
use crate::model::kernels::kquant::QK_K;
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;

/// Sixteen rows' i8 scales (at `src`), each in both 16-bit halves of its row's 32-bit lane.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; `src` holds sixteen bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn scales_in_both_halves(src: *const u8) -> __m512i {
    let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(src as *const _));
    _mm512_or_si512(
        _mm512_and_si512(scale, _mm512_set1_epi32(0xFFFF)),
        _mm512_slli_epi32::<16>(scale),
    )
}

/// The staged bytes of 64 signed values `q` (sixteen rows' four, row `j` in lane `j`) times
/// their rows' scales (`scales`, [`scales_in_both_halves`]): with `N = 1` the products
/// themselves, which the format guarantees to be signed bytes; with `N = 2` the low part
/// `l = ((p + 64) mod 128) − 64` (−64..=63) and the high part `h = (p − l) / 128` of each
/// product `p`, so `p = l + 128·h` exactly and `h` is a signed byte for `|p| ≤ 4096`. The
/// products are formed per 16-bit lane on the sign-extended even and odd bytes.
///
/// # Safety
/// The CPU must support AVX-512 F/BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn scaled_bytes<const N: usize>(q: __m512i, scales: __m512i) -> [__m512i; N] {
    let even = _mm512_mullo_epi16(_mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(q)), scales);
    let odd = _mm512_mullo_epi16(_mm512_srai_epi16::<8>(q), scales);
    let bytes = |even: __m512i, odd: __m512i| {
        _mm512_or_si512(
            _mm512_and_si512(even, _mm512_set1_epi16(0x00FF)),
            _mm512_slli_epi16::<8>(odd),
        )
    };
    if N == 1 {
        return [bytes(even, odd); N];
    }
    let low = |p: __m512i| {
        let sixty_four = _mm512_set1_epi16(64);
        let wrapped = _mm512_and_si512(_mm512_add_epi16(p, sixty_four), _mm512_set1_epi16(127));
        _mm512_sub_epi16(wrapped, sixty_four)
    };
    let high = |p: __m512i, l: __m512i| _mm512_srai_epi16::<7>(_mm512_sub_epi16(p, l));
    let (even_low, odd_low) = (low(even), low(odd));
    let parts = [
        bytes(even_low, odd_low),
        bytes(high(even, even_low), high(odd, odd_low)),
    ];
    std::array::from_fn(|t| parts[t])
}

/// Writes the `N` staged parts of the values `4·row..4·row + 4` of a super-block's sixteen
/// weight rows (`q`, row `j`'s in lane `j`, times `scales`: [`scaled_bytes`]) into `staged`, the
/// super-block's [`scaled_staged_bytes`]: per 64-value chunk `row / 16`, `N` tiles, whose
/// row `row % 16` holds them (bytes `4j..4j + 4`: weight row `j`), the `B` tile's layout.
///
/// # Safety
/// The CPU must support AVX-512 F/BW; `staged` holds a super-block's staged bytes, `row < 64`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn stage_row<const N: usize>(
    staged: *mut u8,
    row: usize,
    q: __m512i,
    scales: __m512i,
) {
    let chunk = staged.add((row / 16) * N * STAGED_TILE + 64 * (row % 16));
    for (part, bytes) in scaled_bytes::<N>(q, scales).into_iter().enumerate() {
        _mm512_storeu_si512(chunk.add(part * STAGED_TILE) as *mut _, bytes);
    }
}

/// Super-block `b`'s (at `src`, its rows' f16 `d` first) float step on `sums` (the exact
/// scaled integer sums per panel row): `acc = fma(d_w·d_a, sum, acc)`.
///
/// # Safety
/// The CPU must support AVX-512 F and F16C; `b` is a super-block of the job's panel.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn accumulate_super_block(
    job: &Q8KJob<'_>,
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

/// A super-block's float step for one panel: its job (the panel), the super-block's bytes in
/// the group, its index, the exact scaled sums per panel row, and the panel's accumulators
/// (the sums', then a second pair for a format's mins).
pub(crate) type FloatStep =
    unsafe fn(&Q8KJob<'_>, *const u8, usize, &[__m512i; PANEL], &mut [[__m512; PANEL]; 2]);

/// A run of panels against a staged group (`N` tiles per 64-value chunk, [`stage_row`]) and
/// their staged activations ([`stage_pairs`](super::shared_x86::stage_pairs)): super-block by
/// super-block (its staged 4 or 8 KiB stay in L1 while every pair of the run passes), per pair
/// of panels, four chunks of 64 values, each one `A` load, `N` `B` loads and `N` full
/// 16 × 64 × 16 `tdpbssd`, so the `N` sums of the whole super-block form in the tiles and
/// leave them once; the sum (`N = 1`) or `low + 128·high` (`N = 2`) is the AVX-512 path's
/// exact integer, and `step` (blocks of `block_bytes` in the group) its float step. Each
/// unit's vector work is issued after the next unit's tile products.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C, `tiles` must be usable (see
/// [`Tiles`]), `job.staged` and `job.pairs` written for this job, and `step` safe to call on
/// this CPU with the group's super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_scaled<T: Tiles, const N: usize>(
    tiles: &mut T,
    job: &StagedJob<'_, Q8KPanel<'_>>,
    accumulators: &mut [StagedAcc],
    (block_bytes, step): (usize, FloatStep),
) {
    let staged_bytes = scaled_staged_bytes(N);
    let pairs = job.panels.len().div_ceil(2);
    assert!(job.blocks.end <= job.nb && job.staged.len() >= job.blocks.len() * staged_bytes);
    assert!(job.group.len() >= job.nb * block_bytes);
    assert_pairs(job);
    assert!(accumulators.len() >= job.panels.len());
    let mut acc: Vec<[[__m512; PANEL]; 2]> = accumulators[..job.panels.len()]
        .iter()
        .map(|a| load_acc(a))
        .collect();
    let activations_of = |b: usize, q: usize| pair_block(job, b, q);
    // The tiles (all 16 rows of 64 bytes): `C` tmm0..N, the sums of each staged part, 16
    // activation rows (a panel pair) × 16 weight rows (i32); `A` tmm4–tmm5 by chunk parity, a
    // chunk's 64 activations of the 16 rows; `B` by chunk parity too, the chunk's staged parts
    // (`N = 1`: tmm6, tmm7; `N = 2`: tmm6–tmm7, tmm2–tmm3).
    const B_TILES: [u8; 4] = [6, 7, 2, 3];
    let multiply = |tiles: &mut T, b: usize, q: usize| {
        let staged = job
            .staged
            .as_ptr()
            .add((b - job.blocks.start) * staged_bytes);
        let activations = activations_of(b, q);
        for c in 0..N {
            tiles.zero(c as u8);
        }
        for c in 0..QK_K / 64 {
            let a = 4 + (c % 2) as u8;
            let parts = &B_TILES[(c % 2) * N..][..N];
            let chunk = staged.add(N * c * STAGED_TILE);
            tiles.load(a, activations.add(64 * c), QK_K);
            for (part, &tile) in parts.iter().enumerate() {
                tiles.load(tile, chunk.add(part * STAGED_TILE), 64);
            }
            for (part, &tile) in parts.iter().enumerate() {
                tiles.dp_ss(part as u8, a, tile);
            }
        }
    };
    let consume = |b: usize, q: usize, parts: &[PairSums; N]| {
        let src = job.group.as_ptr().add(b * block_bytes);
        let pair = 2 * q..(2 * q + 2).min(job.panels.len());
        for (half, (&a, acc)) in job.panels[pair.clone()]
            .iter()
            .zip(&mut acc[pair])
            .enumerate()
        {
            let sums: [__m512i; PANEL] = std::array::from_fn(|r| {
                let at = |part: usize| {
                    _mm512_loadu_si512(parts[part][PANEL * half + r].as_ptr() as *const _)
                };
                if N == 1 {
                    at(0)
                } else {
                    _mm512_add_epi32(at(0), _mm512_slli_epi32::<7>(at(1)))
                }
            });
            let job = Q8KJob {
                group: job.group,
                nb: job.nb,
                a,
            };
            step(&job, src, b, &sums, acc);
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
    for (vectors, acc) in acc.iter().zip(accumulators) {
        store_acc(vectors, acc);
    }
}

/// A panel's outputs from [`run_scaled`]'s accumulators after the last slice: `acc − acc_min`
/// where the format has mins (the AVX-512 path's last step), else `acc`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn staged_outputs(acc: &StagedAcc, mins: bool) -> GroupOut {
    let [mut sums, minima] = load_acc(acc);
    if mins {
        for (sum, min) in sums.iter_mut().zip(&minima) {
            *sum = _mm512_sub_ps(*sum, *min);
        }
    }
    crate::model::kernels::avx512::lanes_to_outputs(&sums)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::kquant::iq4xs::IQ4_NL_VALUES;

    /// Stages 64 values against every scale of `scales` in `N` parts and checks that the parts
    /// sum to each product exactly (the low part in −64..=63 where there are two).
    fn check_products<const N: usize>(values: [i8; 64], scales: impl Iterator<Item = i8>) {
        let bytes_of = |v: __m512i| {
            let mut out = [0i8; 64];
            // SAFETY: 64 bytes into 64 bytes; the caller checked AVX-512F.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut _, v) };
            out
        };
        for scale in scales {
            // Each of the sixteen rows' scale is `scale`.
            let row_scales = [scale; 16];
            // SAFETY: the caller checked AVX-512 F/BW; sixteen and 64 bytes.
            let parts = unsafe {
                let q = _mm512_loadu_si512(values.as_ptr() as *const _);
                scaled_bytes::<N>(q, scales_in_both_halves(row_scales.as_ptr() as *const u8))
            }
            .map(bytes_of);
            for (i, &q) in values.iter().enumerate() {
                let want = q as i32 * scale as i32;
                if N == 1 {
                    assert_eq!(parts[0][i] as i32, want, "{q}·{scale}");
                } else {
                    let (l, h) = (parts[0][i] as i32, parts[1][i] as i32);
                    assert!((-64..=63).contains(&l), "{q}·{scale}: low part {l}");
                    assert_eq!(l + 128 * h, want, "{q}·{scale}: {l} + 128·{h}");
                }
            }
        }
    }

    #[test]
    fn staged_products_are_exact_for_every_value_and_scale() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            println!("SKIPPED: AVX-512 not in this CPU");
            return;
        }
        // Q6_K: every value −32..=31 times every i8 scale (Q3_K's −4..=3 × −32..=31 among
        // them), two parts.
        check_products::<2>(std::array::from_fn(|i| i as i8 - 32), -128i8..=127);
        // IQ4_XS: every table value times every scale −32..=31, two parts.
        check_products::<2>(std::array::from_fn(|i| IQ4_NL_VALUES[i % 16]), -32i8..=31);
        // Q2_K: every value 0..=3 times every scale 0..=15, one part.
        check_products::<1>(std::array::from_fn(|i| (i % 4) as i8), 0i8..=15);
    }
}
