//! IQ4_XS weights ([`crate::model::kernels::kquant::iq4xs`]) repacked at load into interleaved
//! groups of [`GROUP`] rows, × Q8_K activations: the design of [`super::q4k`] (one 32-bit lane
//! per weight row, eight 32-value sub-blocks per super-block, each sub-block's integer sum
//! times its integer scale) with IQ4_NL's table lookup of [`super::q4`] for the values.
//!
//! Layout, per group of sixteen rows and super-block (2208 bytes for the file's 16 × 136):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`;
//! - `[32, 160)`: the signed scales `ls − 32`, sub-block `s` at `32 + 16s`, row `j`'s at byte `j`;
//! - `[160, 2208)`: the indices, per sub-block `s` four 64-byte runs at `160 + 256s + 64t`:
//!   bytes `4j..4j + 4` of run `t` are row `j`'s file bytes `16s + 4t..16s + 4t + 4`, whose low
//!   nibbles index values `32s + 4t + c` (c < 4), their high nibbles values `32s + 16 + 4t + c`
//!   (an IQ4_NL block's layout in [`super::q4`], per sub-block).
//!
//! Float order, per output, over the super-blocks in order from zero: the exact i32
//! `sum = Σ_s (ls_s − 32)·Σ_e table[index_e]·q_a[e]`, then `acc = fma(d_w·d_a, sum as f32, acc)`
//! (ggml's `vec_dot_iq4_xs_q8_K` forms the same integer per super-block on x86). The integer
//! forms differently per level, exactly: the AVX-512 VNNI path (sixteen rows per register)
//! looks each index up as the unsigned byte `table + 128` (`vpshufb`), so `vpdpbusd` applies,
//! and subtracts `128·Σ_s (ls_s − 32)·Σq_a` (two sub-blocks per `vpdpwssd` against the
//! activations' sub-block sums); the AVX2 path (eight rows) multiplies `|table[index]|` by the
//! activation with the value's sign, widening every step (a pair is at most 2·127·127); the
//! portable one takes the signed values; the AMX path stages each value times its scale as two
//! signed bytes (`|table·(ls − 32)| ≤ 127·32`) and forms the super-block's integer in the tiles
//! (`scaled_tiles_x86`, as Q6_K's). So every level gives the same bits.

use half::f16;

use super::{decoded_blocks, dot_i8, lane_f16, Format, GroupOut, Job, Rows16Matrix, GROUP};
use crate::model::kernels::kquant::iq4xs::{Iq4XsBlock, IQ4_NL_VALUES, SUB_BLOCKS};
use crate::model::kernels::kquant::q8k::{Q8KPanel, Q8KPanels};
use crate::model::kernels::kquant::{SuperBlock, QK_K};
use crate::model::kernels::panel::PANEL;

/// Offset of the signed scales in a group's super-block.
const SCALES: usize = 2 * GROUP;
/// Offset of the indices.
const INDICES: usize = SCALES + SUB_BLOCKS * GROUP;
/// Bytes of one sub-block's indices in a group.
const SUB_BLOCK_BYTES: usize = 16 * GROUP;

/// The IQ4_XS format of the interleaved-rows driver.
pub struct Iq4Xs;

/// An IQ4_XS weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 138
/// bytes per super-block (the file's 136, the scales unpacked), plus the last group's padding
/// rows.
pub type Iq4XsRows16 = Rows16Matrix<Iq4Xs>;

/// A job of this format.
pub(crate) type XsJob<'a> = Job<'a, Q8KPanel<'a>>;

impl Iq4Xs {
    /// The index (0..16) of value `e` of lane `lane` in a group's super-block.
    fn index(src: &[u8], lane: usize, e: usize) -> usize {
        let (s, i) = (e / 32, e % 32);
        let (t, c) = ((i % 16) / 4, i % 4);
        let byte = src[INDICES + SUB_BLOCK_BYTES * s + 64 * t + 4 * lane + c];
        (if i < 16 { byte & 0x0F } else { byte >> 4 }) as usize
    }

    /// Lane `lane`'s scale `ls − 32` of sub-block `s`.
    fn scale(src: &[u8], lane: usize, s: usize) -> i8 {
        src[SCALES + GROUP * s + lane] as i8
    }
}

impl Format for Iq4Xs {
    type Act = Q8KPanels;
    const NAME: &'static str = "IQ4_XS";
    const FILE_BLOCK_BYTES: usize = Iq4XsBlock::FILE_BYTES;
    const GROUP_BLOCK_BYTES: usize = INDICES + SUB_BLOCKS * SUB_BLOCK_BYTES;

    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        let blk = Iq4XsBlock::decode(file);
        dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.to_le_bytes());
        for (s, &scale) in blk.scales.iter().enumerate() {
            dst[SCALES + GROUP * s + lane] = scale as u8;
        }
        for (s, bytes) in blk.index_bytes().chunks_exact(16).enumerate() {
            for (t, four) in bytes.chunks_exact(4).enumerate() {
                dst[INDICES + SUB_BLOCK_BYTES * s + 64 * t + 4 * lane..][..4].copy_from_slice(four);
            }
        }
    }

    /// ggml's dequantization, `(d·(ls − 32))·table[index]`.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * Self::scale(src, lane, e / 32) as f32;
            *o = dl * IQ4_NL_VALUES[Self::index(src, lane, e)] as f32;
        }
    }

    fn portable(job: &XsJob<'_>) -> GroupOut {
        let mut acc = [[0f32; GROUP]; PANEL];
        let decode = |src: &[u8], lane: usize, w: &mut [i8; QK_K]| {
            for (e, w) in w.iter_mut().enumerate() {
                *w = IQ4_NL_VALUES[Self::index(src, lane, e)];
            }
        };
        let len = Self::GROUP_BLOCK_BYTES;
        decoded_blocks(job.group, job.nb, len, decode, |b, src, w| {
            let d: [f32; GROUP] = std::array::from_fn(|lane| lane_f16(src, 0, lane));
            for (r, acc) in acc.iter_mut().enumerate() {
                let i = b * PANEL + r;
                let (qa, da) = (&job.a.qs[i], job.a.d[i]);
                for (lane, w) in w.iter().enumerate() {
                    let sum: i32 = (0..SUB_BLOCKS)
                        .map(|s| {
                            let dot = dot_i8(&w[32 * s..][..32], &qa[32 * s..][..32]);
                            Self::scale(src, lane, s) as i32 * dot
                        })
                        .sum();
                    acc[lane] = (d[lane] * da).mul_add(sum as f32, acc[lane]);
                }
            }
        });
        acc
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &XsJob<'_>) -> GroupOut {
        x86::group_avx2(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &XsJob<'_>) -> GroupOut {
        x86::group_avx512(job)
    }

    /// Each value times its sub-block's scale as two signed bytes (`|p| ≤ 127·32`).
    const STAGED_BLOCK_BYTES: usize = super::scaled_staged_bytes(2);

    #[cfg(target_arch = "x86_64")]
    unsafe fn stage(group: &[u8], nb: usize, blocks: std::ops::Range<usize>, staged: &mut [u8]) {
        x86::stage_scaled_values(group, nb, blocks, staged)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_staged<T: super::tiles::Tiles>(
        tiles: &mut T,
        job: &super::StagedJob<'_, Q8KPanel<'_>>,
        acc: &mut [super::StagedAcc],
    ) {
        let group = (Self::GROUP_BLOCK_BYTES, x86::float_step as _);
        super::scaled_tiles_x86::run_scaled::<T, 2>(tiles, job, acc, group)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn staged_outputs(acc: &super::StagedAcc) -> GroupOut {
        super::scaled_tiles_x86::staged_outputs(acc, false)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "iq4xs_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "iq4xs_tests.rs"]
mod tests;
