//! Signed 8-bit block weights × f32 activations: GGUF Q5_0 (decoded at load to −16..15) and
//! Q8_0. Each activation row is quantized to Q8_0 (32-value blocks, scale `d`;
//! [`super::Q8Panels`], as llama.cpp's CPU backend quantizes them), and each output is
//! `Σ_blocks d_w·d_a·Σ(q_w·q_a)`.
//!
//! Why: Q5_0 is llama.cpp's fallback type for K-quant rows that are not a multiple of 256
//! (Gemma 3's 640-wide rows, SmolLM2's 576 under `--quantize q4_k_m`), and Q8_0 is the output
//! layer of both test models and every matrix of a Q8_0 file; candle's Q5_0 product has no SIMD
//! path on x86 and its Q8_0 one is per row. Our first kernel mirrored ggml's
//! `vec_dot_q8_0_q8_0` (eight float lanes per output, a horizontal sum per output): the
//! Llama-3.2-1B shape in Q8_0 reached half the arithmetic rate of the Q4_K and Q6_K files
//! (1.03–1.3× llama.cpp against 1.7–1.9×). Here, as in [`super::q4_0`], the weights are
//! repacked at load into groups of [`GROUP`] rows whose blocks are interleaved: per block, the
//! group's sixteen f16 scales, then eight 64-byte runs where run `t` holds, for each row `j`
//! of the group, values `4t..4t+4` of that row's block (the signed bytes). One 32-bit lane per
//! weight row: a broadcast of four activation bytes meets sixteen rows' four weights in one
//! `vpdpbusd`, each output's whole-block integer sum forms in its own lane and nothing is ever
//! reduced across lanes. Q8_0 holds the file's 34 bytes per block; Q5_0 34 (the file's 22,
//! decoded so one kernel serves both).
//!
//! Float order, fixed per output element whatever the level, thread count or neighbours:
//! `acc = fma(d_w·d_a, Σ_{e<32} q_w[e]·q_a[e], acc)` over the blocks in order, from zero. The
//! integer sums are exact whichever instructions form them: AVX-512 VNNI multiplies
//! `q_w + 128` (unsigned) by `q_a` and starts from `−128·Σq_a`; AVX2 multiplies `|q_w|` by
//! `q_a` with `q_w`'s sign (pairs below 2¹⁵: 128·127·2); so the AVX-512 path (sixteen rows per
//! register), the AVX2 path (eight), the AMX path (`tdpbssd` on the runs as stored: they are
//! already the tile's layout) and the portable one give the same bits.

use half::f16;

use super::{Format, GroupOut, Job, Q8Panel, Q8Panels, Rows16Matrix, GROUP};
use crate::model::kernels::panel::{BLOCK, PANEL};

/// Bytes of one GGUF Q5_0 block: f16 d, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_0_BLOCK_BYTES: usize = 22;
/// Bytes of one GGUF Q8_0 block: f16 d, 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Bytes of one block of a group: the scales, then the values.
const GROUP_BLOCK_BYTES: usize = GROUP * Q8_0_BLOCK_BYTES;
/// Offset of the values in a group's block.
const VALUES: usize = 2 * GROUP;

/// The Q8_0 format of the interleaved-rows driver.
pub struct Q8_0;

/// The Q5_0 format: its blocks decoded at load to Q8_0's group layout (values −16..15), and
/// Q8_0's kernels.
pub struct Q5_0;

/// A Q8_0 weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 34 bytes
/// per block (plus the last group's padding rows).
pub type Q8_0Rows16 = Rows16Matrix<Q8_0>;

/// A Q5_0 weight matrix `[n, k]` in Q8_0's group layout: 34 bytes per block.
pub type Q5_0Rows16 = Rows16Matrix<Q5_0>;

/// A job of these formats.
pub(crate) type Int8Job<'a> = Job<'a, Q8Panel<'a>>;

/// Writes a block's 32 signed values (`values` decodes them from the file's block) and its
/// scale into lane `lane` of a group's block.
fn pack_values(src: &[u8], dst: &mut [u8], lane: usize, values: impl Fn(&[u8], &mut [u8; 32])) {
    dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
    let mut q = [0u8; 32];
    values(src, &mut q);
    for (t, four) in q.chunks_exact(4).enumerate() {
        dst[VALUES + 64 * t + 4 * lane..][..4].copy_from_slice(four);
    }
}

/// Value `e` of lane `lane` in a group's block.
fn weight(src: &[u8], lane: usize, e: usize) -> i8 {
    src[VALUES + 64 * (e / 4) + 4 * lane + e % 4] as i8
}

impl Format for Q8_0 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q8_0";
    const FILE_BLOCK_BYTES: usize = Q8_0_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = GROUP_BLOCK_BYTES;

    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        pack_values(src, dst, lane, |b, q| q.copy_from_slice(&b[2..34]));
    }

    /// `d·q` per value: the same numbers as ggml's (and candle's) Q5_0 and Q8_0
    /// dequantization.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
        for (e, o) in out.iter_mut().enumerate() {
            *o = weight(src, lane, e) as f32 * d;
        }
    }

    fn portable(job: &Int8Job<'_>) -> GroupOut {
        std::array::from_fn(|lane| {
            std::array::from_fn(|r| {
                let mut acc = 0f32;
                for b in 0..job.nb {
                    let src = &job.group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                    let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
                    let (qa, da) = (&job.a.qs[b * PANEL + r], job.a.d[b * PANEL + r]);
                    let sum: i32 = (0..BLOCK)
                        .map(|e| weight(src, lane, e) as i32 * qa[e] as i32)
                        .sum();
                    acc = (d * da).mul_add(sum as f32, acc);
                }
                acc
            })
        })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx2(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx512(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Int8Job<'_>) -> Option<GroupOut> {
        Some(x86::group_amx(tiles, job))
    }
}

impl Format for Q5_0 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q5_0";
    const FILE_BLOCK_BYTES: usize = Q5_0_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = GROUP_BLOCK_BYTES;

    /// `(nibble | high bit << 4) − 16`, as a signed byte.
    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        pack_values(src, dst, lane, |b, q| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let nibbles = &b[6..22];
            for j in 0..16 {
                let lo = (nibbles[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (nibbles[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                q[j] = lo.wrapping_sub(16);
                q[j + 16] = hi.wrapping_sub(16);
            }
        });
    }

    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        Q8_0::dequantize(src, lane, out)
    }

    fn portable(job: &Int8Job<'_>) -> GroupOut {
        Q8_0::portable(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Int8Job<'_>) -> GroupOut {
        Q8_0::avx2(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Int8Job<'_>) -> GroupOut {
        Q8_0::avx512(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Int8Job<'_>) -> Option<GroupOut> {
        Q8_0::amx(tiles, job)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q8_0_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q8_0_tests.rs"]
mod tests;
