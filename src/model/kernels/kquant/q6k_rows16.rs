//! Q6_K weights repacked at load into interleaved groups of [`GROUP`] rows, × Q8_K activations.
//!
//! Why: the panel kernel of [`super::q6k`] decodes a super-block of one weight row and meets
//! eight activation rows with it, every product of a row landing in the lanes of its own
//! register, so each super-block ends in a horizontal reduction and per-row offset fix-ups; a
//! profile of the Llama-3.2-1B shape in Q6_K spent 54% of the time there (0.61× llama.cpp).
//! Here, as in [`super::super::q4_0`], one 32-bit lane belongs to one weight row: a broadcast
//! of four activation bytes meets sixteen rows' four weights in one `vpdpbusd`, the sum of a
//! 16-value sub-block forms in each row's lane, is multiplied by that row's scale in one
//! `vpmulld`, and nothing is ever reduced across lanes.
//!
//! Layout, per group of sixteen rows and super-block (16 × 210 bytes, the file's size):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`;
//! - `[32, 288)`: the scales, sub-block `s` at `32 + 16s`, row `j`'s at byte `j`;
//! - `[288, 2336)`: the low four bits, two 64-byte runs per sub-block: run `2s + u`, bytes
//!   `4j..4j + 4`, hold in their low nibbles values `16s + 4u + c` (c < 4) of row `j`, in
//!   their high nibbles values `16s + 8 + 4u + c`;
//! - `[2336, 3360)`: the top two bits, one 64-byte run per sub-block: run `s`, byte `4j + c`,
//!   bits `2t, 2t + 1` for value `16s + 4t + c` of row `j`.
//!
//! Float order, per output, the same as [`super::q6k`]'s (so the same bits as before the
//! repacking): the super-block's sum `Σ_s scale_s·Σ_e (q_e − 32)·a_e` is exact in i32 (the
//! SIMD paths start each sub-block's sum at `−32·bsum_s` and add the unsigned products), then
//! `acc = fma(d_w·d_a, sum as f32, acc)` over the super-blocks in order, from zero. The
//! AVX-512 VNNI path (sixteen rows per register), the AVX2 path (eight) and the portable one
//! give the same bits.

use half::f16;
use rayon::prelude::*;

use super::super::panel::{self, PANEL};
use super::super::Isa;
use super::q6k::Q6KBlock;
use super::q8k::{Q8KPanel, Q8KPanels};
use super::{SuperBlock, QK_K};

/// Weight rows interleaved per group (one per 32-bit lane of a 512-bit register).
pub const GROUP: usize = 16;
/// Bytes of one super-block of a group.
const GROUP_BLOCK_BYTES: usize = GROUP * Q6KBlock::FILE_BYTES;
/// Offset of the scales in a group's super-block.
const SCALES: usize = 2 * GROUP;
/// Offset of the low four bits.
const NIBBLES: usize = SCALES + 16 * GROUP;
/// Offset of the top two bits.
const HIGH: usize = NIBBLES + 32 * 64;
/// Sub-blocks of 16 values per super-block.
const SUB_BLOCKS: usize = QK_K / 16;

/// A Q6_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows (the last
/// group padded with zero rows).
pub struct Q6KRows16 {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// Where the four low bits (byte, high nibble?) and the two top bits (byte, shift) of value
/// `e` of lane `j` lie in a group's super-block.
fn value_place(j: usize, e: usize) -> ((usize, bool), (usize, usize)) {
    let (s, i) = (e / 16, e % 16);
    let (t, c) = (i / 4, i % 4);
    let nibble = NIBBLES + 64 * (2 * s + t % 2) + 4 * j + c;
    let high = HIGH + 64 * s + 4 * j + c;
    ((nibble, t >= 2), (high, 2 * t))
}

impl Q6KRows16 {
    /// From GGUF Q6_K bytes of a `[n, k]` tensor; `None` unless `k` is a multiple of 256 and
    /// `bytes` has the size of `n·k/256` super-blocks.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let file_row = (k / QK_K).checked_mul(Q6KBlock::FILE_BYTES)?;
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
                    for (b, src) in row.chunks_exact(Q6KBlock::FILE_BYTES).enumerate() {
                        let dst = &mut group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                        pack_super_block(src, dst, lane);
                    }
                }
            });
        Some(Self { n, k, data })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: 210 per super-block, as in the file (plus the last group's padding rows).
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

    /// Row `j` as f32: the numbers and float operations of ggml's (and candle's) Q6_K
    /// dequantization, `d·scale·(q − 32)`.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let lane = j % GROUP;
        let blocks = self.group(j / GROUP).chunks_exact(GROUP_BLOCK_BYTES);
        for (out, src) in out.chunks_exact_mut(QK_K).zip(blocks) {
            let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
            for (e, o) in out.iter_mut().enumerate() {
                let scale = src[SCALES + 16 * (e / 16) + lane] as i8;
                let q = value(src, lane, e) as i8 - 32;
                *o = d * scale as f32 * q as f32;
            }
        }
    }

    /// Group `g`'s super-blocks.
    fn group(&self, g: usize) -> &[u8] {
        let len = (self.k / QK_K) * GROUP_BLOCK_BYTES;
        &self.data[g * len..][..len]
    }
}

/// Writes one row's super-block (the file's 210 bytes) into lane `lane` of a group's
/// super-block, eight values at a time with word arithmetic: the repacking is part of every
/// load (byte by byte it was a fifth of a 1B Q6_K model's set-up).
///
/// Sub-block `s = 8h + 2i + r` holds values `128h + 32i + 16r + x` (x < 16): their low bits
/// are 16 consecutive bytes of the file's `ql` from `64h + 32(i mod 2) + 16r` (high nibbles
/// when i ≥ 2), their top bits 16 consecutive bytes of `qh` from `128 + 32h + 16r`, at bit
/// `2i` (as `Q6KBlock::value`).
fn pack_super_block(file: &[u8], dst: &mut [u8], lane: usize) {
    const LOW4: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const LOW2: u64 = 0x0303_0303_0303_0303;
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[..8]);
        u64::from_le_bytes(w)
    };
    dst[2 * lane..2 * lane + 2].copy_from_slice(&file[208..210]);
    for (s, &scale) in file[192..208].iter().enumerate() {
        dst[SCALES + 16 * s + lane] = scale;
    }
    for s in 0..SUB_BLOCKS {
        let (h, i, r) = (s / 8, (s % 8) / 2, s % 2);
        let ql = &file[64 * h + 32 * (i % 2) + 16 * r..][..16];
        let qh = &file[128 + 32 * h + 16 * r..][..16];
        let (low_shift, high_shift) = (4 * (i / 2) as u32, 2 * i as u32);
        // Bytes x of `low_a`/`low_b`: the low four bits of values x and 8 + x.
        let low_a = (word(&ql[..8]) >> low_shift) & LOW4;
        let low_b = (word(&ql[8..]) >> low_shift) & LOW4;
        // Runs 2s and 2s + 1: values 4u + c in the low nibbles, 8 + 4u + c in the high.
        let runs = (low_a | (low_b << 4)).to_le_bytes();
        dst[NIBBLES + 64 * (2 * s) + 4 * lane..][..4].copy_from_slice(&runs[..4]);
        dst[NIBBLES + 64 * (2 * s + 1) + 4 * lane..][..4].copy_from_slice(&runs[4..]);
        // Byte c of run s: value 4t + c's top bits at bits 2t (t < 4).
        let high_a = (word(&qh[..8]) >> high_shift) & LOW2;
        let high_b = (word(&qh[8..]) >> high_shift) & LOW2;
        let top = (high_a & 0xFFFF_FFFF)
            | ((high_a >> 32) << 2)
            | ((high_b & 0xFFFF_FFFF) << 4)
            | ((high_b >> 32) << 6);
        dst[HIGH + 64 * s + 4 * lane..][..4].copy_from_slice(&top.to_le_bytes()[..4]);
    }
}

/// The unsigned 6-bit value (0..64) of value `e` of lane `lane` in a group's super-block.
fn value(src: &[u8], lane: usize, e: usize) -> u8 {
    let ((nibble, upper), (high, shift)) = value_place(lane, e);
    let low = if upper {
        src[nibble] >> 4
    } else {
        src[nibble] & 0x0F
    };
    low | (((src[high] >> shift) & 3) << 4)
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
            && job.a.bsums.len() >= job.nb * PANEL
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
            let mut acc = 0f32;
            for b in 0..job.nb {
                let src = &job.group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
                let (qa, da) = (&job.a.qs[b * PANEL + r], job.a.d[b * PANEL + r]);
                let mut sum = 0i32;
                for s in 0..SUB_BLOCKS {
                    let scale = src[SCALES + 16 * s + lane] as i8 as i32;
                    let dot: i32 = (16 * s..16 * s + 16)
                        .map(|e| (value(src, lane, e) as i32 - 32) * qa[e] as i32)
                        .sum();
                    sum += scale * dot;
                }
                acc = (d * da).mul_add(sum as f32, acc);
            }
            acc
        })
    })
}

impl super::super::OwnMatrix for Q6KRows16 {
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
#[path = "q6k_rows16_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q6k_rows16_tests.rs"]
mod tests;
