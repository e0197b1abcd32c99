//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's sub-block sums form in its own lane; the same exact integers and the same float
//! operations per output as [`super::NibblesK`]'s portable definition. `HIGH` selects Q5_K
//! (a fifth bit per value) over Q4_K at compile time.

use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::super::shared_x86::{assert_pairs, load_acc, pair_block, store_acc};
use super::super::shared_x86::{pipeline_units, PairSums, FULL_TILES, STAGED_TILE};
use super::super::shared_x86::{q8k_word as activation_word, sub_block_sum_pair};
use super::super::tiles::Tiles;
use super::super::{Format, StagedAcc, StagedJob};
use super::{
    GroupOut, KJob, NibblesK, DMIN, GROUP, HIGH_BITS, MINS, NIBBLES, SCALES, STAGED_BYTES,
    SUB_BLOCKS,
};
use crate::model::kernels::kquant::q8k::Q8KPanel;
use crate::model::kernels::kquant::q8k::SUB_BLOCK_PAIRS;
use crate::model::kernels::kquant::QK_K;
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of one super-block of a group.
const fn block_bytes<const HIGH: bool>() -> usize {
    <NibblesK<HIGH> as Format>::GROUP_BLOCK_BYTES
}

/// Run `t`'s values of sub-block `s` (of a group's super-block at `src`) as bytes, 64 of them:
/// the run's low or high nibbles, and for Q5_K bit `s` of the run's high-bit bytes as bit 4
/// (a 16-bit shift moves it within its byte: from bit `s` ≤ 7 to bit 4, nothing crosses).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn values_avx512<const HIGH: bool>(src: *const u8, s: usize, t: usize) -> __m512i {
    let low = _mm512_set1_epi8(0x0F);
    let raw = _mm512_loadu_si512(src.add(NIBBLES + 512 * (s / 2) + 64 * t) as *const _);
    let nibbles = if s.is_multiple_of(2) {
        _mm512_and_si512(raw, low)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low)
    };
    if !HIGH {
        return nibbles;
    }
    let qh = _mm512_loadu_si512(src.add(HIGH_BITS + 64 * t) as *const _);
    let placed = if s <= 4 {
        _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - s as i32))
    } else {
        _mm512_srl_epi16(qh, _mm_cvtsi32_si128(s as i32 - 4))
    };
    _mm512_or_si512(nibbles, _mm512_and_si512(placed, _mm512_set1_epi8(0x10)))
}

/// [`values_avx512`] for half `half` of the group (32 bytes: eight weight rows).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_avx2<const HIGH: bool>(
    src: *const u8,
    s: usize,
    t: usize,
    half: usize,
) -> __m256i {
    let low = _mm256_set1_epi8(0x0F);
    let at = NIBBLES + 512 * (s / 2) + 64 * t + 32 * half;
    let raw = _mm256_loadu_si256(src.add(at) as *const __m256i);
    let nibbles = if s.is_multiple_of(2) {
        _mm256_and_si256(raw, low)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low)
    };
    if !HIGH {
        return nibbles;
    }
    let qh = _mm256_loadu_si256(src.add(HIGH_BITS + 64 * t + 32 * half) as *const __m256i);
    let placed = if s <= 4 {
        _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - s as i32))
    } else {
        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32 - 4))
    };
    _mm256_or_si256(nibbles, _mm256_and_si256(placed, _mm256_set1_epi8(0x10)))
}

/// Sixteen weight rows per 512-bit register; VNNI forms each lane's four products per step,
/// `vpdpwssd` two sub-blocks' mins terms per step.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
/// checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_avx512<const HIGH: bool>(job: &KJob<'_>) -> GroupOut {
    let mut acc = ([_mm512_setzero_ps(); PANEL], [_mm512_setzero_ps(); PANEL]);
    for b in 0..job.nb {
        let src = job.group.as_ptr().add(b * block_bytes::<HIGH>());
        let mut sums = [_mm512_setzero_si512(); PANEL];
        for s in 0..SUB_BLOCKS {
            let w: [__m512i; 8] = std::array::from_fn(|t| values_avx512::<HIGH>(src, s, t));
            let scale =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(src.add(SCALES + GROUP * s) as *const _));
            for (r, sum) in sums.iter_mut().enumerate() {
                let i = b * PANEL + r;
                let mut t = _mm512_setzero_si512();
                for (step, w) in w.iter().enumerate() {
                    let a = _mm512_set1_epi32(activation_word(job, i, 32 * s + 4 * step));
                    t = _mm512_dpbusd_epi32(t, *w, a);
                }
                *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(t, scale));
            }
        }
        accumulate_super_block(job, src, b, &sums, &mut acc);
    }
    outputs(&acc)
}

/// The float accumulators of the AVX-512 and AMX paths: `acc` and `acc_min` per panel row.
type Accumulators = ([__m512; PANEL], [__m512; PANEL]);

/// Super-block `b`'s (at `src`) mins terms (`vpdpwssd` of two sub-blocks' mins against the activation
/// sums) and its float step on `sums` (the scaled integer sums per panel row).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn accumulate_super_block(
    job: &KJob<'_>,
    src: *const u8,
    b: usize,
    sums: &[__m512i; PANEL],
    (acc, acc_min): &mut Accumulators,
) {
    let mut mins = [_mm512_setzero_si512(); PANEL];
    for t in 0..SUB_BLOCK_PAIRS {
        let min =
            |s: usize| _mm512_cvtepu8_epi32(_mm_loadu_si128(src.add(MINS + GROUP * s) as *const _));
        let pair = _mm512_or_si512(min(2 * t), _mm512_slli_epi32::<16>(min(2 * t + 1)));
        for (r, mins) in mins.iter_mut().enumerate() {
            let a = _mm512_set1_epi32(sub_block_sum_pair(job, b, t, r));
            *mins = _mm512_dpwssd_epi32(*mins, pair, a);
        }
    }
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i));
    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(src.add(DMIN) as *const __m256i));
    for r in 0..PANEL {
        let da = _mm512_set1_ps(*job.a.d.get_unchecked(b * PANEL + r));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(sums[r]), acc[r]);
        acc_min[r] = _mm512_fmadd_ps(
            _mm512_mul_ps(dmin, da),
            _mm512_cvtepi32_ps(mins[r]),
            acc_min[r],
        );
    }
}

/// `acc − acc_min`, lanes to outputs.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn outputs((acc, acc_min): &Accumulators) -> GroupOut {
    let mut diff = *acc;
    for (d, m) in diff.iter_mut().zip(acc_min) {
        *d = _mm512_sub_ps(*d, *m);
    }
    crate::model::kernels::avx512::lanes_to_outputs(&diff)
}

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass; `maddubs` forms each lane's two pairs of products per step, the steps are added in
/// 16 bits, and one `madd` against the rows' scales (each 32-bit lane the scale twice) both
/// widens and scales them — exact: a pair is at most 2·15·128 = 3840 for Q4_K (eight steps
/// 30720) and 2·31·128 = 7936 for Q5_K (four steps 31744), below 2¹⁵, so Q4_K adds all
/// eight steps in 16 bits and Q5_K two runs of four. One multiply per step instead of two
/// and no `mullo` per sub-block; `madd` forms two sub-blocks' mins terms.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2<const HIGH: bool>(job: &KJob<'_>) -> GroupOut {
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut acc_min = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * block_bytes::<HIGH>());
            let mut sums = [_mm256_setzero_si256(); ROWS];
            for s in 0..SUB_BLOCKS {
                let w: [__m256i; 8] = std::array::from_fn(|t| values_avx2::<HIGH>(src, s, t, half));
                let scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    src.add(SCALES + GROUP * s + 8 * half) as *const __m128i,
                ));
                let scale = _mm256_or_si256(scale, _mm256_slli_epi32::<16>(scale));
                for (dr, sum) in sums.iter_mut().enumerate() {
                    let i = b * PANEL + r0 + dr;
                    // Steps added in 16 bits: all eight for Q4_K, runs of four for Q5_K.
                    let run = if HIGH { 4 } else { 8 };
                    for (c, steps) in w.chunks_exact(run).enumerate() {
                        let mut pairs = _mm256_setzero_si256();
                        for (step, w) in steps.iter().enumerate() {
                            let at = 32 * s + 4 * (c * run + step);
                            let a = _mm256_set1_epi32(activation_word(job, i, at));
                            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(*w, a));
                        }
                        *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, scale));
                    }
                }
            }
            let mut mins = [_mm256_setzero_si256(); ROWS];
            for t in 0..SUB_BLOCK_PAIRS {
                let min = |s: usize| {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        src.add(MINS + GROUP * s + 8 * half) as *const __m128i
                    ))
                };
                let pair = _mm256_or_si256(min(2 * t), _mm256_slli_epi32::<16>(min(2 * t + 1)));
                for (dr, mins) in mins.iter_mut().enumerate() {
                    let a = _mm256_set1_epi32(sub_block_sum_pair(job, b, t, r0 + dr));
                    *mins = _mm256_add_epi32(*mins, _mm256_madd_epi16(pair, a));
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(src.add(16 * half) as *const __m128i));
            let dmin =
                _mm256_cvtph_ps(_mm_loadu_si128(src.add(DMIN + 16 * half) as *const __m128i));
            for dr in 0..ROWS {
                let da = _mm256_set1_ps(*job.a.d.get_unchecked(b * PANEL + r0 + dr));
                let (d, m) = (_mm256_mul_ps(dw, da), _mm256_mul_ps(dmin, da));
                acc[dr] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums[dr]), acc[dr]);
                acc_min[dr] = _mm256_fmadd_ps(m, _mm256_cvtepi32_ps(mins[dr]), acc_min[dr]);
            }
        }
        let diff: [__m256; ROWS] = std::array::from_fn(|dr| _mm256_sub_ps(acc[dr], acc_min[dr]));
        diff
    })
}

/// Stages a Q4_K or Q5_K group for [`pair_amx`]: per super-block and 64-value chunk `c`
/// (sub-blocks `2c` and `2c + 1`), two tiles, the values times the low three bits of their
/// sub-block's scale, then times the high three bits (`scale = 8·high + low`, each ≤ 7, so
/// every product, ≤ 15·7 = 105 for Q4_K and 31·7 = 217 for Q5_K, is an unsigned byte); row `8h + t` of a tile holds values `4t..4t + 4` of sub-block `2c + h`
/// of each weight row (bytes `4j..4j + 4`: row `j`), the tile's layout. The product of a
/// 16-bit lane by its scale (≤ 7) is bytewise: each byte's product fits in its byte.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn stage_split_scales<const HIGH: bool>(
    group: &[u8],
    nb: usize,
    blocks: Range<usize>,
    staged: &mut [u8],
) {
    assert!(group.len() >= nb * block_bytes::<HIGH>() && blocks.end <= nb);
    assert!(staged.len() >= blocks.len() * STAGED_BYTES);
    let low = _mm512_set1_epi32(7);
    let in_both_halves = |x: __m512i| _mm512_or_si512(x, _mm512_slli_epi32::<16>(x));
    for (i, b) in blocks.enumerate() {
        let src = group.as_ptr().add(b * block_bytes::<HIGH>());
        for s in 0..SUB_BLOCKS {
            let scale =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(src.add(SCALES + GROUP * s) as *const _));
            let lo = in_both_halves(_mm512_and_si512(scale, low));
            let hi = in_both_halves(_mm512_srli_epi32::<3>(scale));
            let tiles = staged
                .as_mut_ptr()
                .add(i * STAGED_BYTES + (s / 2) * 2 * STAGED_TILE);
            for t in 0..8 {
                let q = values_avx512::<HIGH>(src, s, t);
                let row = tiles.add(64 * (8 * (s % 2) + t));
                _mm512_storeu_si512(row as *mut _, _mm512_mullo_epi16(q, lo));
                _mm512_storeu_si512(row.add(STAGED_TILE) as *mut _, _mm512_mullo_epi16(q, hi));
            }
        }
    }
}

/// A run of panels against a staged Q4_K or Q5_K group ([`stage_split_scales`]) and their
/// staged activations ([`stage_pairs`](super::super::shared_x86::stage_pairs)): super-block by super-block (so its staged 8 KiB stay
/// in L1 while every panel of the run passes), per two pairs of panels (32 rows), four chunks
/// of 64 values, each two `A` loads, two `B` loads and four full 16 × 64 × 16 `tdpbsud`
/// (signed activations, unsigned staged bytes), so the sums `Σ_s low_s·dot_s` and
/// `Σ_s high_s·dot_s` of the whole super-block form in the tiles and leave them once, with no
/// per-sub-block vector work; then `8·high + low` is the AVX-512 path's exact
/// `Σ_s scale_s·dot_s`, and the mins and float step are its own, super-block after super-block
/// per output. Each unit's vector work is issued after the next unit's tile products, so the
/// two units overlap.
///
/// # Safety
/// As [`group_avx512`], `tiles` must be usable (see [`Tiles`]) and `job.staged` and
/// `job.pairs` written by [`stage_split_scales`] and [`stage_pairs`](super::super::shared_x86::stage_pairs) for this job.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run_amx<T: Tiles, const HIGH: bool>(
    tiles: &mut T,
    job: &StagedJob<'_, Q8KPanel<'_>>,
    accumulators: &mut [StagedAcc],
) {
    let pairs = job.panels.len().div_ceil(2);
    let quads = pairs.div_ceil(2);
    assert!(job.blocks.end <= job.nb && job.staged.len() >= job.blocks.len() * STAGED_BYTES);
    assert_pairs(job);
    assert!(accumulators.len() >= job.panels.len());
    let mut acc: Vec<Accumulators> = accumulators[..job.panels.len()]
        .iter()
        .map(|a| {
            let [sums, mins] = load_acc(a);
            (sums, mins)
        })
        .collect();
    // The unit's two pairs (a lone last pair twice: its second copy is not used).
    let pairs_of = |u: usize| [2 * u, (2 * u + 1).min(pairs - 1)];
    let activations_of = |b: usize, q: usize| pair_block(job, b, q);
    // The tiles (all 16 rows of 64 bytes): `C` tmm0–tmm3, for each of two panel pairs
    // the low- and high-scale sums, 16 activation rows × 16 weight rows (i32); `A` tmm4–tmm5, a
    // chunk's 64 activations of each pair's 16 rows; `B` tmm6–tmm7, the chunk's staged low- and
    // high-scale values. Each `A` and `B` meets two others, and the four accumulators are four
    // independent chains (with two, a unit waited on the products' latency: 1.7× slower).
    let multiply = |tiles: &mut T, b: usize, u: usize| {
        let staged = job
            .staged
            .as_ptr()
            .add((b - job.blocks.start) * STAGED_BYTES);
        let [a0, a1] = pairs_of(u).map(|q| activations_of(b, q));
        for c in 0..4 {
            tiles.zero(c);
        }
        for c in 0..QK_K / 64 {
            tiles.load(4, a0.add(64 * c), QK_K);
            tiles.load(5, a1.add(64 * c), QK_K);
            tiles.load(6, staged.add(2 * c * STAGED_TILE), 64);
            tiles.load(7, staged.add((2 * c + 1) * STAGED_TILE), 64);
            tiles.dp_su(0, 4, 6);
            tiles.dp_su(1, 4, 7);
            tiles.dp_su(2, 5, 6);
            tiles.dp_su(3, 5, 7);
        }
    };
    let consume = |b: usize, u: usize, sums: &[PairSums; 4]| {
        let src = job.group.as_ptr().add(b * block_bytes::<HIGH>());
        let first = 4 * u;
        let panels = first..(first + 4).min(job.panels.len());
        for (i, (&a, acc)) in job.panels[panels.clone()]
            .iter()
            .zip(&mut acc[panels])
            .enumerate()
        {
            let (lo, hi) = (&sums[2 * (i / 2)], &sums[2 * (i / 2) + 1]);
            let half = i % 2;
            let sums: [__m512i; PANEL] = std::array::from_fn(|r| {
                let lo = _mm512_loadu_si512(lo[PANEL * half + r].as_ptr() as *const _);
                let hi = _mm512_loadu_si512(hi[PANEL * half + r].as_ptr() as *const _);
                _mm512_add_epi32(_mm512_slli_epi32::<3>(hi), lo)
            });
            let job = KJob {
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
        (job.blocks.clone(), quads),
        multiply,
        |b, u| pairs_of(u).map(|q| activations_of(b, q)),
        consume,
    );
    for ((sums, mins), acc) in acc.iter().zip(accumulators) {
        store_acc(&[*sums, *mins], acc);
    }
}

/// A panel's outputs from [`run_amx`]'s accumulators after the last slice.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn staged_outputs(acc: &StagedAcc) -> GroupOut {
    let [sums, mins] = load_acc(acc);
    outputs(&(sums, mins))
}
