//! The x86 micro-kernels of [`super`]: one 32-bit lane per weight row of the group, so each
//! output's whole-block integer sum forms in its own lane; the same exact integers and the
//! same float operations per output as [`super::FourBit`]'s portable definition. `MIN`
//! selects Q4_1 (minima, no offset) over Q4_0 at compile time, `NL` IQ4_NL (each nibble looked
//! up as its table byte plus 128, the sum started from `−128·Σq_a`).

use super::super::shared_x86::{self as shared, AVX2_ROWS as ROWS};
use super::super::tiles::{self, TileConfig, Tiles};
use super::super::Format;
use super::{FourBit, GroupOut, Q4Job, IQ4_NL_BYTES, IQ4_NL_VALUES};
use crate::model::kernels::panel::{BLOCK, PANEL};
use std::arch::x86_64::*;

/// The block's integer sums start from `−offset·Σq_a` (Q4_0's `− 8`, Q4_1's nothing,
/// IQ4_NL's `− 128`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_sum<const MIN: bool, const NL: bool>(job: &Q4Job<'_>, i: usize) -> i32 {
    -FourBit::<MIN, NL>::OFFSET * *job.a.sums.get_unchecked(i)
}

/// Sixteen bytes repeated in each 128-bit lane, for `vpshufb` lookups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn table512(bytes: [u8; 16]) -> __m512i {
    _mm512_broadcast_i32x4(_mm_loadu_si128(bytes.as_ptr() as *const __m128i))
}

/// The bytes the products take for 64 nibbles (one per byte): the nibbles themselves, or
/// (`NL`) IQ4_NL's table bytes plus 128 (`table`, from [`table512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn value_bytes<const NL: bool>(nibbles: __m512i, table: __m512i) -> __m512i {
    if NL {
        _mm512_shuffle_epi8(table, nibbles)
    } else {
        nibbles
    }
}

/// Four activation bytes of block `i`, from byte `4·step`, in every 32-bit lane: they meet
/// weight values `4·step..4·step + 4` (steps 0..4 the low nibbles of the four runs, 4..8 the
/// high ones).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn activation_word(job: &Q4Job<'_>, i: usize, step: usize) -> i32 {
    (job.a.qs.as_ptr().add(i) as *const u8)
        .add(4 * step)
        .cast::<i32>()
        .read_unaligned()
}

/// Sixteen weight rows per 512-bit register; VNNI forms each lane's four products per step.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
/// checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_avx512<const MIN: bool, const NL: bool>(job: &Q4Job<'_>) -> GroupOut {
    let low = _mm512_set1_epi8(0x0F);
    let table = table512(IQ4_NL_BYTES);
    let mut acc = [_mm512_setzero_ps(); PANEL];
    for b in 0..job.nb {
        let src = job
            .group
            .as_ptr()
            .add(b * FourBit::<MIN, NL>::GROUP_BLOCK_BYTES);
        let scales = shared::scales::<MIN>(src);
        let mut w = [_mm512_setzero_si512(); 8];
        for t in 0..4 {
            let at = FourBit::<MIN, NL>::NIBBLES + 64 * t;
            let raw = _mm512_loadu_si512(src.add(at) as *const _);
            w[t] = value_bytes::<NL>(_mm512_and_si512(raw, low), table);
            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
            w[t + 4] = value_bytes::<NL>(high, table);
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let i = b * PANEL + r;
            let mut s = _mm512_set1_epi32(offset_sum::<MIN, NL>(job, i));
            for (step, w) in w.iter().enumerate() {
                let a = _mm512_set1_epi32(activation_word(job, i, step));
                s = _mm512_dpbusd_epi32(s, *w, a);
            }
            *acc_r = shared::block_step::<MIN>(job, i, scales, s, *acc_r);
        }
    }
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}

/// Eight weight rows per 256-bit register (the group in two halves), four panel rows per
/// pass; `maddubs` forms each lane's two pairs of products per step, the block's eight steps
/// are added in 16 bits and one `madd` widens them: exact, since a pair of nibble ×
/// activation is at most 2·15·128 = 3840 and eight of them 30720 < 2¹⁵ (so neither the
/// pairs saturate nor their sum wraps). One multiply per step instead of two (`madd` per
/// step), on CPUs whose vector multiplies are the scarce port.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2<const MIN: bool>(job: &Q4Job<'_>) -> GroupOut {
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job
                .group
                .as_ptr()
                .add(b * FourBit::<MIN>::GROUP_BLOCK_BYTES);
            // The run the outer loop: its nibbles unpacked once for the pass's rows, every
            // partial sum in a register (block-outer, eight weight registers spilled).
            let mut pairs = [_mm256_setzero_si256(); ROWS];
            for t in 0..4 {
                let at = FourBit::<MIN>::NIBBLES + 64 * t + 32 * half;
                let raw = _mm256_loadu_si256(src.add(at) as *const __m256i);
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
                for (dr, p) in pairs.iter_mut().enumerate() {
                    let i = b * PANEL + r0 + dr;
                    let a_lo = _mm256_set1_epi32(activation_word(job, i, t));
                    let a_hi = _mm256_set1_epi32(activation_word(job, i, t + 4));
                    *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(lo, a_lo));
                    *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(hi, a_hi));
                }
            }
            let scales = shared::scales_avx2::<MIN>(src, half);
            for (dr, (acc_r, p)) in acc.iter_mut().zip(pairs).enumerate() {
                let i = b * PANEL + r0 + dr;
                let s = _mm256_add_epi32(
                    _mm256_madd_epi16(p, ones),
                    _mm256_set1_epi32(offset_sum::<MIN, false>(job, i)),
                );
                *acc_r = shared::block_step_avx2::<MIN>(job, i, scales, s, *acc_r);
            }
        }
        acc
    })
}

/// IQ4_NL: eight weight rows per 256-bit register, four panel rows per pass, each nibble
/// looked up as its signed table value; `maddubs` + `madd` form each lane's four products per
/// step as `|value|` times `q_a` with the value's sign (llama.cpp's way:
/// [`shared::signed_table_step_avx2`]), with no offset: the integer `Σ table[n]·q_a` the other
/// levels form as `Σ (table[n] + 128)·q_a − 128·Σq_a`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the job's lengths were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_avx2_signed_table(job: &Q4Job<'_>) -> GroupOut {
    type Nl = FourBit<false, true>;
    let table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_NL_VALUES.as_ptr() as *const __m128i));
    shared::passes_avx2(|half, r0| {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..job.nb {
            let src = job.group.as_ptr().add(b * Nl::GROUP_BLOCK_BYTES);
            let mut sums = [_mm256_setzero_si256(); ROWS];
            for t in 0..4 {
                let at = Nl::NIBBLES + 64 * t + 32 * half;
                let raw = _mm256_loadu_si256(src.add(at) as *const __m256i);
                let word =
                    |h: usize, dr: usize| activation_word(job, b * PANEL + r0 + dr, t + 4 * h);
                shared::signed_table_step_avx2(raw, table, word, &mut sums);
            }
            let scales = shared::scales_avx2::<false>(src, half);
            for (dr, (acc, s)) in acc.iter_mut().zip(sums).enumerate() {
                *acc = shared::block_step_avx2::<false>(job, b * PANEL + r0 + dr, scales, s, *acc);
            }
        }
        acc
    })
}

/// Tiles: `C` (tmm0) the integer sums, 8 panel rows × 16 weight rows (i32); `A` (tmm4) the
/// panel's block, 8 rows × 32 bytes; `B` (tmm6) the block's nibbles as bytes, 8 rows (four
/// values each) × 16 weight rows.
const TILES: TileConfig = tiles::pipelined_config(BLOCK as u16);

/// Per block, one `tdpbsud` (signed activations × unsigned nibbles) forms all 8 × 16 sums;
/// run `t`'s low nibbles become `B` row `t` (values `4t..4t + 4`), its high nibbles row
/// `t + 4` (values `16 + 4t..`), so `B`'s K order is the values' order, and `A` is the panel's
/// block as quantized. Then, per panel row, the AVX-512 path's float operations on the same
/// integers (`Σ nibble·q_a − 8·Σq_a` for Q4_0, then Q4_1's `m_w·s_a`).
///
/// # Safety
/// As [`group_avx512`], and `tiles` must be usable (see [`Tiles`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_amx<T: Tiles, const MIN: bool, const NL: bool>(
    tiles: &mut T,
    job: &Q4Job<'_>,
) -> GroupOut {
    let low = _mm512_set1_epi8(0x0F);
    let table = table512(IQ4_NL_BYTES);
    let mut acc = [_mm512_setzero_ps(); PANEL];
    // One unpacked block per weight tile, so a block's bytes are not overwritten while the
    // tile unit may still be reading the previous one's.
    let mut weights = [[0u8; 8 * 64]; 2];
    let block = |b: usize| {
        job.group
            .as_ptr()
            .add(b * FourBit::<MIN, NL>::GROUP_BLOCK_BYTES)
    };
    tiles.configure(&TILES);
    tiles::pipelined(
        tiles,
        job.nb,
        |tiles, b, t| {
            let src = block(b);
            let w = weights[(t.b - 6) as usize].as_mut_ptr();
            for run in 0..4 {
                let at = FourBit::<MIN, NL>::NIBBLES + 64 * run;
                let raw = _mm512_loadu_si512(src.add(at) as *const _);
                let low_values = value_bytes::<NL>(_mm512_and_si512(raw, low), table);
                _mm512_storeu_si512(w.add(64 * run) as *mut _, low_values);
                let high = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
                let high_values = value_bytes::<NL>(high, table);
                _mm512_storeu_si512(w.add(64 * (run + 4)) as *mut _, high_values);
            }
            tiles.zero(t.c);
            tiles.load(t.a, job.a.qs.as_ptr().add(b * PANEL) as *const u8, BLOCK);
            tiles.load(t.b, w, 64);
            tiles.dp_su(t.c, t.a, t.b);
        },
        |b, sums| {
            let scales = shared::scales::<MIN>(block(b));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let i = b * PANEL + r;
                let s = _mm512_add_epi32(
                    _mm512_loadu_si512(sums[r].as_ptr() as *const _),
                    _mm512_set1_epi32(offset_sum::<MIN, NL>(job, i)),
                );
                *acc_r = shared::block_step::<MIN>(job, i, scales, s, *acc_r);
            }
        },
    );
    crate::model::kernels::avx512::lanes_to_outputs(&acc)
}
