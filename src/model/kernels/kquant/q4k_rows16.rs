//! Q4_K weights repacked at load into interleaved groups of [`GROUP`] rows, × Q8_K activations:
//! the design of [`super::q6k_rows16`] (one 32-bit lane per weight row, `vpdpbusd` against
//! broadcast activation bytes, no reduction across lanes) for the Q4_K tensors of Q4_K_M files.
//!
//! Layout, per group of sixteen rows and super-block (2368 bytes for the file's 16 × 144, the
//! 6-bit scales and mins unpacked to bytes as [`super::q4k`] holds them):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`; `[32, 64)`: their f16 `dmin`;
//! - `[64, 192)`: the scales, sub-block `s` at `64 + 16s`, row `j`'s at byte `j`;
//! - `[192, 320)`: the mins, laid out as the scales;
//! - `[320, 2368)`: the values, eight 64-byte runs per pair `g` of sub-blocks: run `8g + t`,
//!   bytes `4j..4j + 4`, hold in their low nibbles values `64g + 4t + c` (c < 4) of row `j`
//!   (sub-block `2g`), in their high nibbles values `64g + 32 + 4t + c` (sub-block `2g + 1`).
//!
//! Float order, per output, the same as [`super::q4k`]'s (so the same bits as before the
//! repacking): exact i32 `sum = Σ_s scale_s·Σ_e q_e·a_e` and
//! `mins = Σ_s min_s·(bsum_{2s} + bsum_{2s+1})` per super-block, then over the super-blocks in
//! order, from zero, `acc = fma(d_w·d_a, sum as f32, acc)` and
//! `acc_min = fma(dmin_w·d_a, mins as f32, acc_min)`; the output is `acc − acc_min`. The
//! AVX-512 VNNI path (sixteen rows per register), the AVX2 path (eight) and the portable one
//! give the same bits.

use half::f16;
use rayon::prelude::*;

use super::super::panel::{self, PANEL};
use super::super::Isa;
use super::q4k::Q4KBlock;
use super::q8k::{Q8KPanel, Q8KPanels, SUB_BLOCK_PAIRS};
use super::{SuperBlock, QK_K};

/// Weight rows interleaved per group (one per 32-bit lane of a 512-bit register).
pub const GROUP: usize = 16;
/// Offset of the f16 `dmin` in a group's super-block.
const DMIN: usize = 2 * GROUP;
/// Offset of the scales.
const SCALES: usize = DMIN + 2 * GROUP;
/// Offset of the mins.
const MINS: usize = SCALES + SUB_BLOCKS * GROUP;
/// Offset of the values.
const NIBBLES: usize = MINS + SUB_BLOCKS * GROUP;
/// Bytes of one super-block of a group.
const GROUP_BLOCK_BYTES: usize = NIBBLES + QK_K / 2 * GROUP;
/// Sub-blocks of 32 values per super-block.
const SUB_BLOCKS: usize = QK_K / 32;

/// A Q4_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows (the last
/// group padded with zero rows).
pub struct Q4KRows16 {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// Where value `e` of lane `j` lies in a group's super-block: byte, and whether in the high
/// nibble.
fn value_place(j: usize, e: usize) -> (usize, bool) {
    let (g, upper, i) = (e / 64, (e / 32) % 2 == 1, e % 32);
    let (t, c) = (i / 4, i % 4);
    (NIBBLES + 64 * (8 * g + t) + 4 * j + c, upper)
}

impl Q4KRows16 {
    /// From GGUF Q4_K bytes of a `[n, k]` tensor; `None` unless `k` is a multiple of 256 and
    /// `bytes` has the size of `n·k/256` super-blocks.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let file_row = (k / QK_K).checked_mul(Q4KBlock::FILE_BYTES)?;
        if k == 0 || !k.is_multiple_of(QK_K) || bytes.len() != n.checked_mul(file_row)? {
            return None;
        }
        let nb = k / QK_K;
        let mut data = vec![0u8; n.div_ceil(GROUP) * nb * GROUP_BLOCK_BYTES];
        data.par_chunks_mut(nb * GROUP_BLOCK_BYTES)
            .enumerate()
            .for_each(|(g, group)| {
                for lane in 0..GROUP.min(n - g * GROUP) {
                    let row = &bytes[(g * GROUP + lane) * file_row..][..file_row];
                    for (b, src) in row.chunks_exact(Q4KBlock::FILE_BYTES).enumerate() {
                        let dst = &mut group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                        pack_super_block(&Q4KBlock::decode(src), dst, lane);
                    }
                }
            });
        Some(Self { n, k, data })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: 148 per super-block (the file's 144, scales and mins unpacked), plus the
    /// last group's padding rows.
    pub fn storage_bytes(&self) -> usize {
        self.data.len()
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(x, m, super::super::isa())
    }

    /// [`Self::matmul`] at level `isa` (capped to this process's): every level gives the same
    /// bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        let isa = super::path(isa);
        let a = Q8KPanels::quantize(x, m, self.k);
        let nb = self.k / QK_K;
        panel::drive(m, self.n, GROUP, |p, j, out| {
            let job = Job {
                group: self.group(j / GROUP),
                nb,
                a: a.panel(p),
            };
            let all = group_at(&job, isa);
            out.copy_from_slice(&all[..out.len()]);
        })
    }

    /// Row `j` as f32: the numbers and float operations of ggml's (and candle's) Q4_K
    /// dequantization, `(d·scale)·q − dmin·min`.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let lane = j % GROUP;
        let blocks = self.group(j / GROUP).chunks_exact(GROUP_BLOCK_BYTES);
        for (out, src) in out.chunks_exact_mut(QK_K).zip(blocks) {
            let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
            let dmin = f16::from_le_bytes([src[DMIN + 2 * lane], src[DMIN + 2 * lane + 1]]);
            for (e, o) in out.iter_mut().enumerate() {
                let s = e / 32;
                let scale = d * src[SCALES + GROUP * s + lane] as f32;
                let min = dmin.to_f32() * src[MINS + GROUP * s + lane] as f32;
                *o = scale * value(src, lane, e) as f32 - min;
            }
        }
    }

    /// Group `g`'s super-blocks.
    fn group(&self, g: usize) -> &[u8] {
        let len = (self.k / QK_K) * GROUP_BLOCK_BYTES;
        &self.data[g * len..][..len]
    }
}

/// Writes one row's super-block into lane `lane` of a group's super-block (by structure, not
/// per value: the repacking is part of every model load).
fn pack_super_block(blk: &Q4KBlock, dst: &mut [u8], lane: usize) {
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
}

/// The 4-bit value of value `e` of lane `lane` in a group's super-block.
fn value(src: &[u8], lane: usize, e: usize) -> u8 {
    let (at, upper) = value_place(lane, e);
    if upper {
        src[at] >> 4
    } else {
        src[at] & 0x0F
    }
}

/// One group of weight rows against one panel.
pub(crate) struct Job<'a> {
    /// The group's interleaved super-blocks.
    pub group: &'a [u8],
    /// Super-blocks per row.
    pub nb: usize,
    pub a: Q8KPanel<'a>,
}

/// The outputs `[weight row of the group][panel row]` of a job at level `isa`.
fn group_at(job: &Job<'_>, isa: Isa) -> [[f32; PANEL]; GROUP] {
    assert!(
        job.group.len() == job.nb * GROUP_BLOCK_BYTES
            && job.a.qs.len() >= job.nb * PANEL
            && job.a.d.len() >= job.nb * PANEL
            && job.a.sub_block_sums.len() >= job.nb * SUB_BLOCK_PAIRS
    );
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `isa` is at most the process's level (AVX-512 VNNI on top of AVX2 + FMA +
        // F16C for `Avx512`); the lengths were checked above.
        if isa >= Isa::Avx512 {
            return unsafe { x86::group_avx512(job) };
        }
        if isa >= Isa::Avx2 {
            return unsafe { x86::group_avx2(job) };
        }
    }
    let _ = isa;
    group_portable(job)
}

/// The definition, one output at a time.
pub(crate) fn group_portable(job: &Job<'_>) -> [[f32; PANEL]; GROUP] {
    std::array::from_fn(|lane| {
        std::array::from_fn(|r| {
            let (mut acc, mut acc_min) = (0f32, 0f32);
            for b in 0..job.nb {
                let src = &job.group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
                let dmin = f16::from_le_bytes([src[DMIN + 2 * lane], src[DMIN + 2 * lane + 1]]);
                let i = b * PANEL + r;
                let (qa, bsums) = (&job.a.qs[i], &job.a.bsums[i]);
                let (mut sum, mut mins) = (0i32, 0i32);
                for s in 0..SUB_BLOCKS {
                    let dot: i32 = (32 * s..32 * s + 32)
                        .map(|e| value(src, lane, e) as i32 * qa[e] as i32)
                        .sum();
                    sum += src[SCALES + GROUP * s + lane] as i32 * dot;
                    let bsum = bsums[2 * s] as i32 + bsums[2 * s + 1] as i32;
                    mins += src[MINS + GROUP * s + lane] as i32 * bsum;
                }
                let da = job.a.d[i];
                acc = (d * da).mul_add(sum as f32, acc);
                acc_min = (dmin.to_f32() * da).mul_add(mins as f32, acc_min);
            }
            acc - acc_min
        })
    })
}

impl super::super::OwnMatrix for Q4KRows16 {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn storage_bytes(&self) -> usize {
        self.storage_bytes()
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul(x, m)
    }

    fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        self.dequantize_row(j, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q4k_rows16_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q4k_rows16_tests.rs"]
mod tests;
