//! The x86 steps shared by the interleaved-rows kernels: for the formats on Q8_0/Q8_1
//! activations ([`super::q4`], [`super::q8_0`]) a group block's scales (and minima) and one
//! block's float step per panel row, in AVX-512 and AVX2, so every format with minima (Q4_1,
//! Q5_1) adds them in the same place; and the AVX2 kernels' write-out of their lanes.

use super::tiles::{TileConfig, Tiles};
use super::{GroupOut, Job, Q8Panel, GROUP, MINIMA};
use crate::model::kernels::kquant::q8k::Q8KPanel;
use crate::model::kernels::kquant::QK_K;
use crate::model::kernels::panel::PANEL;
use std::arch::x86_64::*;

/// One step of the AVX2 kernels of IQ4_NL's table (IQ4_NL, IQ4_XS): `raw`, 32 bytes of index
/// pairs (eight weight rows × four bytes), each nibble looked up in `table` (the signed values
/// in both 128-bit lanes), times the activations with the values' signs: adds to `dots[dr]`
/// the products of the low nibbles with the four bytes `word(0, dr)` and of the high nibbles
/// with `word(1, dr)`. `maddubs` takes `|value|` and the activation with the value's sign (a
/// pair is at most 2·127·127 = 32258: no saturation; two pairs may exceed 2¹⁵, so every step
/// is widened on its own by `madd`).
///
/// # Safety
/// The CPU must support AVX2; `word` reads only what the caller's job holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn signed_table_step_avx2(
    raw: __m256i,
    table: __m256i,
    word: impl Fn(usize, usize) -> i32,
    dots: &mut [__m256i; AVX2_ROWS],
) {
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let nibbles = [
        _mm256_and_si256(raw, low),
        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
    ];
    for (h, nibbles) in nibbles.into_iter().enumerate() {
        let w = _mm256_shuffle_epi8(table, nibbles);
        let abs = _mm256_sign_epi8(w, w);
        for (dr, dot) in dots.iter_mut().enumerate() {
            let a = _mm256_set1_epi32(word(h, dr));
            let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(a, w));
            *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(pairs, ones));
        }
    }
}

/// A job of the formats on Q8_K activations (the K-quants, IQ4_XS).
pub(crate) type Q8KJob<'a> = Job<'a, Q8KPanel<'a>>;

/// Four Q8_K activation bytes of panel entry `i` (super-block and row), from byte `at`.
///
/// # Safety
/// `i` is an entry of the panel and `at + 4 ≤ 256` (the callers' loops keep both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8k_word(job: &Q8KJob<'_>, i: usize, at: usize) -> i32 {
    (job.a.qs.as_ptr().add(i) as *const u8)
        .add(at)
        .cast::<i32>()
        .read_unaligned()
}

/// Row `r`'s activation sums of sub-blocks `2t` and `2t + 1` of super-block `b`, as two i16
/// (one `madd`/`vpdpwssd` operand against a pair of per-sub-block weights).
///
/// # Safety
/// `b` is a super-block of the panel, `t` < `SUB_BLOCK_PAIRS`, `r` < `PANEL`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn sub_block_sum_pair(job: &Q8KJob<'_>, b: usize, t: usize, r: usize) -> i32 {
    use crate::model::kernels::kquant::q8k::SUB_BLOCK_PAIRS;
    (job.a.sub_block_sums.as_ptr().add(b * SUB_BLOCK_PAIRS + t) as *const i16)
        .add(2 * r)
        .cast::<i32>()
        .read_unaligned()
}

/// A group block's sixteen `d` and (`MIN`) sixteen `m` as f32 lanes (`m` zero otherwise).
///
/// # Safety
/// The CPU must support AVX-512F and F16C; `src` holds the block's scales (and minima).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn scales<const MIN: bool>(src: *const u8) -> [__m512; 2] {
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i));
    let mw = if MIN {
        _mm512_cvtph_ps(_mm256_loadu_si256(src.add(MINIMA) as *const __m256i))
    } else {
        _mm512_setzero_ps()
    };
    [dw, mw]
}

/// One block's float operations for panel entry `i` in sixteen weight rows' lanes, from their
/// exact integer sums `s`: `fma(d_w·d_a, s, acc)`, then (`MIN`) `fma(m_w, s_a, ·)`.
///
/// # Safety
/// As [`scales`]; entry `i` is within the panel (the driver checked its lengths).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn block_step<const MIN: bool>(
    job: &Job<'_, Q8Panel<'_>>,
    i: usize,
    [dw, mw]: [__m512; 2],
    s: __m512i,
    acc: __m512,
) -> __m512 {
    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*job.a.d.get_unchecked(i)));
    let acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc);
    if !MIN {
        return acc;
    }
    _mm512_fmadd_ps(mw, _mm512_set1_ps(*job.a.s.get_unchecked(i)), acc)
}

/// [`block_step`] for eight weight rows in AVX2 lanes.
///
/// # Safety
/// The CPU must support AVX2 and FMA; entry `i` is within the panel.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block_step_avx2<const MIN: bool>(
    job: &Job<'_, Q8Panel<'_>>,
    i: usize,
    [dw, mw]: [__m256; 2],
    s: __m256i,
    acc: __m256,
) -> __m256 {
    let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*job.a.d.get_unchecked(i)));
    let acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), acc);
    if !MIN {
        return acc;
    }
    _mm256_fmadd_ps(mw, _mm256_set1_ps(*job.a.s.get_unchecked(i)), acc)
}

/// Half `half` (eight weight rows) of a group block's `d` and (`MIN`) `m` as f32 lanes.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `src` holds the block's scales (and minima).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scales_avx2<const MIN: bool>(src: *const u8, half: usize) -> [__m256; 2] {
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(src.add(16 * half) as *const __m128i));
    let mw = if MIN {
        _mm256_cvtph_ps(_mm_loadu_si128(
            src.add(MINIMA + 16 * half) as *const __m128i
        ))
    } else {
        _mm256_setzero_ps()
    };
    [dw, mw]
}

/// Panel rows per pass of the AVX2 kernels: their accumulators, integer sums (or sixteen-bit
/// partial sums), a weight register, an activation and the constants fill the 16 registers.
pub(crate) const AVX2_ROWS: usize = 4;

/// The AVX2 kernels' passes over a job: eight weight rows per 256-bit register, so the group
/// in two halves, and [`AVX2_ROWS`] panel rows per pass; `pass(half, r0)` returns the
/// accumulators of panel rows `r0..r0 + AVX2_ROWS` (lane `l`: weight row `8·half + l`), which
/// become the group's outputs.
///
/// # Safety
/// The CPU must support AVX2 (and whatever `pass` needs).
#[inline(always)]
pub(crate) unsafe fn passes_avx2(
    mut pass: impl FnMut(usize, usize) -> [__m256; AVX2_ROWS],
) -> GroupOut {
    let mut out = [[0f32; GROUP]; PANEL];
    for half in 0..2 {
        for r0 in (0..PANEL).step_by(AVX2_ROWS) {
            let acc = pass(half, r0);
            store_half(&mut out, half, r0, &acc);
        }
    }
    out
}

/// An AVX2 kernel's accumulators for panel rows `r0..r0 + acc.len()`, lane `l` weight row
/// `8·half + l`, into the group's outputs.
///
/// # Safety
/// The CPU must support AVX; `r0 + acc.len() ≤ PANEL`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn store_half(out: &mut GroupOut, half: usize, r0: usize, acc: &[__m256]) {
    for (dr, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(out[r0 + dr][8 * half..][..8].as_mut_ptr(), *acc);
    }
}

/// Bytes of one staged tile of the staged AMX kernels: 16 rows of 64 (sixteen weight rows'
/// four values each, or sixteen activation rows' 64 values).
pub(crate) const STAGED_TILE: usize = 1024;

/// Bytes of one pair's super-block of Q8_K activations staged by [`stage_pairs`]: 16 rows of
/// 256.
pub(crate) const PAIR_BLOCK_BYTES: usize = 2 * PANEL * QK_K;

/// The staged AMX kernels' tiles: all eight 16 rows of 64 bytes (every product a full
/// 16 × 64 × 16).
pub(crate) const FULL_TILES: TileConfig = TileConfig::new([(16, 64); 8]);

/// One accumulator tile's sums as a staged kernel stores them: per row of a panel pair, the
/// [`GROUP`] weight rows' i32.
pub(crate) type PairSums = [[i32; GROUP]; 2 * PANEL];

/// The staged AMX kernels' software pipeline over the super-blocks `blocks`, `units` units
/// each (block-major): `multiply(tiles, b, u)` issues a unit's tile products into accumulators
/// `0..N`; then the next unit's staged activations (the `P` pair blocks `activations` names)
/// are prefetched into L1 (a tile load from L2 waited for its rows one after another), the
/// previous unit's sums are consumed (`consume(b, u, sums)`, vector work that overlaps the
/// products still in flight), and only then this unit's accumulators are stored.
///
/// # Safety
/// `tiles` must be usable and configured for `multiply`'s products (see [`Tiles`]), and
/// `activations` must name pair blocks inside the staged activations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn pipeline_units<T: Tiles, const N: usize, const P: usize>(
    tiles: &mut T,
    (blocks, units): (std::ops::Range<usize>, usize),
    mut multiply: impl FnMut(&mut T, usize, usize),
    activations: impl Fn(usize, usize) -> [*const u8; P],
    mut consume: impl FnMut(usize, usize, &[PairSums; N]),
) {
    let mut sums = [[[[0i32; GROUP]; 2 * PANEL]; N]; 2];
    let total = blocks.len() * units;
    let at = |unit: usize| (blocks.start + unit / units, unit % units);
    for unit in 0..total {
        let (b, u) = at(unit);
        multiply(tiles, b, u);
        if unit + 1 < total {
            let (b, u) = at(unit + 1);
            for pair in activations(b, u) {
                for line in 0..PAIR_BLOCK_BYTES / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(pair.add(64 * line) as *const i8);
                }
            }
        }
        if unit > 0 {
            let (b, u) = at(unit - 1);
            consume(b, u, &sums[(unit - 1) % 2]);
        }
        for (t, sums) in sums[unit % 2].iter_mut().enumerate() {
            tiles.store(t as u8, sums.as_mut_ptr() as *mut u8, 4 * GROUP);
        }
    }
    if total > 0 {
        let (b, u) = at(total - 1);
        consume(b, u, &sums[(total - 1) % 2]);
    }
}

/// A staged kernel's accumulators of one panel ([`super::StagedAcc`]) as vectors: per panel
/// row the sums, then the minima's.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn load_acc(acc: &super::StagedAcc) -> [[__m512; PANEL]; 2] {
    std::array::from_fn(|h| std::array::from_fn(|r| _mm512_loadu_ps(acc.0[PANEL * h + r].as_ptr())))
}

/// [`load_acc`]'s inverse.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store_acc(vectors: &[[__m512; PANEL]; 2], acc: &mut super::StagedAcc) {
    for (h, rows) in vectors.iter().enumerate() {
        for (r, v) in rows.iter().enumerate() {
            _mm512_storeu_ps(acc.0[PANEL * h + r].as_mut_ptr(), *v);
        }
    }
}

/// The Q8_K activations of panel pairs as the staged AMX kernels (Q4_K, Q5_K, Q6_K) load them:
/// per super-block, per pair, the first panel's 8 rows of 256 values, then the second's
/// (zeros where there is none), so one 16-row tile holds both panels and a kernel taking a
/// block's pairs one after another reads this buffer in order (and a slice of blocks is one
/// contiguous run of it).
pub(crate) fn stage_pairs(panels: &[Q8KPanel<'_>], nb: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let pairs = panels.len().div_ceil(2);
    let mut out = vec![0u8; pairs * nb * PAIR_BLOCK_BYTES];
    out.par_chunks_mut(pairs * PAIR_BLOCK_BYTES)
        .enumerate()
        .for_each(|(b, block)| {
            for (pair, panels) in block
                .chunks_exact_mut(PAIR_BLOCK_BYTES)
                .zip(panels.chunks(2))
            {
                for (half, panel) in panels.iter().enumerate() {
                    let rows = &panel.qs[b * PANEL..][..PANEL];
                    let dst = &mut pair[half * PANEL * QK_K..][..PANEL * QK_K];
                    for (dst, row) in dst.chunks_exact_mut(QK_K).zip(rows) {
                        // The same bits: the tile reads them as signed bytes again.
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d = v as u8;
                        }
                    }
                }
            }
        });
    out
}

/// Where pair `q` of a staged job's run has block `b` of its activations ([`stage_pairs`]).
///
/// # Safety
/// `b < job.nb`, and the run's pair `q` exists (`job.first_pair + q < job.all_pairs`), in a
/// buffer of `job.nb · job.all_pairs` pair blocks (which the kernels assert).
#[inline]
pub(crate) unsafe fn pair_block(
    job: &super::StagedJob<'_, Q8KPanel<'_>>,
    b: usize,
    q: usize,
) -> *const u8 {
    job.pairs
        .as_ptr()
        .add((b * job.all_pairs + job.first_pair + q) * PAIR_BLOCK_BYTES)
}

/// The staged kernels' checks of a job's staged activations: every pair block of the run is
/// in the buffer.
pub(crate) fn assert_pairs(job: &super::StagedJob<'_, Q8KPanel<'_>>) {
    let pairs = job.panels.len().div_ceil(2);
    assert!(job.first_pair + pairs <= job.all_pairs, "pairs of the run");
    assert!(
        job.pairs.len() >= job.nb * job.all_pairs * PAIR_BLOCK_BYTES,
        "staged activations"
    );
}
