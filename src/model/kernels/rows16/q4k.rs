//! Q4_K and Q5_K weights repacked at load into interleaved groups of [`GROUP`] rows, × Q8_K
//! activations: the design of [`super::q6k`] (one 32-bit lane per weight row, `vpdpbusd`
//! against broadcast activation bytes, no reduction across lanes) for the Q4_K tensors of
//! Q4_K_M files and the Q5_K ones of Q5_K_M files. The two formats differ only in Q5_K's fifth
//! bit per value, so one generic format ([`NibblesK`]) serves both.
//!
//! Layout, per group of sixteen rows and super-block (Q4_K: 2368 bytes for the file's
//! 16 × 144; Q5_K: 2880 for 16 × 176; the 6-bit scales and mins unpacked to bytes as
//! [`crate::model::kernels::kquant::q4k`] holds them):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`; `[32, 64)`: their f16 `dmin`;
//! - `[64, 192)`: the scales, sub-block `s` at `64 + 16s`, row `j`'s at byte `j`;
//! - `[192, 320)`: the mins, laid out as the scales;
//! - `[320, 2368)`: the values, eight 64-byte runs per pair `g` of sub-blocks: run `8g + t`,
//!   bytes `4j..4j + 4`, hold in their low nibbles values `64g + 4t + c` (c < 4) of row `j`
//!   (sub-block `2g`), in their high nibbles values `64g + 32 + 4t + c` (sub-block `2g + 1`);
//! - Q5_K only, `[2368, 2880)`: the file's 32 bytes of high bits per row in eight 64-byte runs
//!   like the values': run `t`, bytes `4j..4j + 4`, are row `j`'s `qh[4t..4t + 4]`, whose bit
//!   `s` is bit 4 of value `32s + 4t + c` — the byte that meets those values' nibbles, so a
//!   shift and a mask per run put each sub-block's fifth bits in place.
//!
//! Float order, per output, ggml's structure and that of the panel kernels this replaced
//! (since removed; so the same bits as before the repacking): exact i32 `sum = Σ_s scale_s·Σ_e q_e·a_e` and
//! `mins = Σ_s min_s·(bsum_{2s} + bsum_{2s+1})` per super-block, then over the super-blocks in
//! order, from zero, `acc = fma(d_w·d_a, sum as f32, acc)` and
//! `acc_min = fma(dmin_w·d_a, mins as f32, acc_min)`; the output is `acc − acc_min`. The
//! AVX-512 VNNI path (sixteen rows per register), the AVX2 path (eight), the AMX path (the
//! scales' 3-bit halves folded into staged values, a super-block's scaled sums formed in the
//! tiles: `x86::run_amx`) and the portable one give the
//! same bits.

use half::f16;

use super::{decoded_blocks, dot_i8, lane_f16, Format, GroupOut, Job, Rows16Matrix, GROUP};
use crate::model::kernels::kquant::q4k::Q4KBlock;
use crate::model::kernels::kquant::q5k::Q5KBlock;
use crate::model::kernels::kquant::q8k::{Q8KPanel, Q8KPanels};
use crate::model::kernels::kquant::{SuperBlock, QK_K};
use crate::model::kernels::panel::PANEL;

/// Offset of the f16 `dmin` in a group's super-block.
const DMIN: usize = 2 * GROUP;
/// Offset of the scales.
const SCALES: usize = DMIN + 2 * GROUP;
/// Offset of the mins.
const MINS: usize = SCALES + SUB_BLOCKS * GROUP;
/// Offset of the values.
const NIBBLES: usize = MINS + SUB_BLOCKS * GROUP;
/// Offset of Q5_K's high bits.
const HIGH_BITS: usize = NIBBLES + QK_K / 2 * GROUP;
/// Sub-blocks of 32 values per super-block.
const SUB_BLOCKS: usize = QK_K / 32;
/// Bytes of one super-block of a group staged for the tile kernel: per 64-value chunk,
/// the values times their scales' low three bits and times the high three, as bytes.
const STAGED_BYTES: usize = QK_K / 64 * 2 * 16 * 64;

/// A K-quant format of 4-bit values with 6-bit sub-block scales and mins: Q4_K, and with a
/// fifth bit per value Q5_K (`HIGH`).
pub struct NibblesK<const HIGH: bool>;

/// The Q4_K format of the interleaved-rows driver.
pub type Q4K = NibblesK<false>;
/// The Q5_K format of the interleaved-rows driver.
pub type Q5K = NibblesK<true>;

/// A Q4_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 148
/// bytes per super-block (the file's 144, scales and mins unpacked), plus the last group's
/// padding rows.
pub type Q4KRows16 = Rows16Matrix<Q4K>;
/// A Q5_K weight matrix `[n, k]`, likewise: 180 bytes per super-block (the file's 176).
pub type Q5KRows16 = Rows16Matrix<Q5K>;

/// A job of these formats.
pub(crate) type KJob<'a> = Job<'a, Q8KPanel<'a>>;

/// One file super-block as the layout takes it (scales and mins unpacked).
struct Decoded<'a> {
    d: f16,
    dmin: f16,
    scales: [u8; 8],
    mins: [u8; 8],
    qs: &'a [u8],
    /// Q5_K's high bits.
    qh: Option<&'a [u8]>,
}

impl<const HIGH: bool> NibblesK<HIGH> {
    fn decode(file: &[u8]) -> Decoded<'_> {
        if HIGH {
            let blk = Q5KBlock::decode(file);
            let (qh, qs) = file[16..].split_at(32);
            Decoded {
                d: blk.d,
                dmin: blk.dmin,
                scales: blk.scales,
                mins: blk.mins,
                qs,
                qh: Some(qh),
            }
        } else {
            let blk = Q4KBlock::decode(file);
            Decoded {
                d: blk.d,
                dmin: blk.dmin,
                scales: blk.scales,
                mins: blk.mins,
                qs: &file[16..],
                qh: None,
            }
        }
    }

    /// The value (4 or 5 bits) of value `e` of lane `lane` in a group's super-block.
    fn value(src: &[u8], lane: usize, e: usize) -> u8 {
        let (g, upper, i) = (e / 64, (e / 32) % 2 == 1, e % 32);
        let (t, c) = (i / 4, i % 4);
        let byte = src[NIBBLES + 64 * (8 * g + t) + 4 * lane + c];
        let nibble = if upper { byte >> 4 } else { byte & 0x0F };
        if !HIGH {
            return nibble;
        }
        let high = (src[HIGH_BITS + 64 * t + 4 * lane + c] >> (e / 32)) & 1;
        nibble | high << 4
    }
}

impl<const HIGH: bool> Format for NibblesK<HIGH> {
    type Act = Q8KPanels;
    const NAME: &'static str = if HIGH { "Q5_K" } else { "Q4_K" };
    const FILE_BLOCK_BYTES: usize = if HIGH {
        Q5KBlock::FILE_BYTES
    } else {
        Q4KBlock::FILE_BYTES
    };
    const GROUP_BLOCK_BYTES: usize = HIGH_BITS + if HIGH { 32 * GROUP } else { 0 };

    /// By structure, not per value: the repacking is part of every model load.
    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        let blk = Self::decode(file);
        dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.to_le_bytes());
        dst[DMIN + 2 * lane..DMIN + 2 * lane + 2].copy_from_slice(&blk.dmin.to_le_bytes());
        for s in 0..SUB_BLOCKS {
            dst[SCALES + GROUP * s + lane] = blk.scales[s];
            dst[MINS + GROUP * s + lane] = blk.mins[s];
        }
        // Byte `32g + i` of the file holds values `64g + i` (low nibble, sub-block 2g) and
        // `64g + 32 + i` (high nibble, sub-block 2g + 1): the runs keep the bytes whole.
        for (g, bytes) in blk.qs.chunks_exact(32).enumerate() {
            for (t, four) in bytes.chunks_exact(4).enumerate() {
                dst[NIBBLES + 64 * (8 * g + t) + 4 * lane..][..4].copy_from_slice(four);
            }
        }
        // High-bit byte `i` serves values `32s + i` of every sub-block `s`.
        if let Some(qh) = blk.qh {
            for (t, four) in qh.chunks_exact(4).enumerate() {
                dst[HIGH_BITS + 64 * t + 4 * lane..][..4].copy_from_slice(four);
            }
        }
    }

    /// The numbers and float operations of ggml's (and candle's) Q4_K and Q5_K
    /// dequantization, `(d·scale)·q − dmin·min`.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
        let dmin = f16::from_le_bytes([src[DMIN + 2 * lane], src[DMIN + 2 * lane + 1]]);
        for (e, o) in out.iter_mut().enumerate() {
            let s = e / 32;
            let scale = d * src[SCALES + GROUP * s + lane] as f32;
            let min = dmin.to_f32() * src[MINS + GROUP * s + lane] as f32;
            *o = scale * Self::value(src, lane, e) as f32 - min;
        }
    }

    fn portable(job: &KJob<'_>) -> GroupOut {
        let (mut acc, mut acc_min) = ([[0f32; GROUP]; PANEL], [[0f32; GROUP]; PANEL]);
        let decode = |src: &[u8], lane: usize, w: &mut [i8; QK_K]| {
            for (e, w) in w.iter_mut().enumerate() {
                *w = Self::value(src, lane, e) as i8;
            }
        };
        let len = Self::GROUP_BLOCK_BYTES;
        decoded_blocks(job.group, job.nb, len, decode, |b, src, w| {
            let d: [f32; GROUP] = std::array::from_fn(|lane| lane_f16(src, 0, lane));
            let dmin: [f32; GROUP] = std::array::from_fn(|lane| lane_f16(src, DMIN, lane));
            for r in 0..PANEL {
                let i = b * PANEL + r;
                let (qa, bsums, da) = (&job.a.qs[i], &job.a.bsums[i], job.a.d[i]);
                for (lane, w) in w.iter().enumerate() {
                    let (mut sum, mut mins) = (0i32, 0i32);
                    for s in 0..SUB_BLOCKS {
                        let dot = dot_i8(&w[32 * s..][..32], &qa[32 * s..][..32]);
                        sum += src[SCALES + GROUP * s + lane] as i32 * dot;
                        let bsum = bsums[2 * s] as i32 + bsums[2 * s + 1] as i32;
                        mins += src[MINS + GROUP * s + lane] as i32 * bsum;
                    }
                    acc[r][lane] = (d[lane] * da).mul_add(sum as f32, acc[r][lane]);
                    acc_min[r][lane] = (dmin[lane] * da).mul_add(mins as f32, acc_min[r][lane]);
                }
            }
        });
        std::array::from_fn(|r| std::array::from_fn(|lane| acc[r][lane] - acc_min[r][lane]))
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &KJob<'_>) -> GroupOut {
        x86::group_avx2::<HIGH>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &KJob<'_>) -> GroupOut {
        x86::group_avx512::<HIGH>(job)
    }

    /// The 6-bit scales, split in two 3-bit halves, fold into the values as unsigned bytes,
    /// so a super-block's scaled sums form in the tiles.
    const STAGED_BLOCK_BYTES: usize = STAGED_BYTES;

    #[cfg(target_arch = "x86_64")]
    unsafe fn stage(group: &[u8], nb: usize, blocks: std::ops::Range<usize>, staged: &mut [u8]) {
        x86::stage_split_scales::<HIGH>(group, nb, blocks, staged)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_staged<T: super::tiles::Tiles>(
        tiles: &mut T,
        job: &super::StagedJob<'_, Q8KPanel<'_>>,
        acc: &mut [super::StagedAcc],
    ) {
        x86::run_amx::<T, HIGH>(tiles, job, acc)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn staged_outputs(acc: &super::StagedAcc) -> GroupOut {
        x86::staged_outputs(acc)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q4k_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q4k_tests.rs"]
mod tests;
