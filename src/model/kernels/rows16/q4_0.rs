//! Q4_0 weights × f32 activations: each activation row quantized to Q8_0 (32-value blocks,
//! scale `d`: [`super::Q8Panels`], as llama.cpp's CPU backend quantizes them), each output
//! `Σ_blocks d_w·d_a·Σ((n_w − 8)·q_a)`.
//!
//! Why this layout: the first kernel of ours mirrored ggml's `vec_dot_q4_0_q8_0`, eight float
//! lanes per output, so every block of every output cost eight conversions and FMAs besides
//! the integer products, and every weight row decoded its nibbles and signs again per panel
//! (SmolLM2 Q4_0: 0.53× llama.cpp, which repacks Q4_0 rows interleaved). Here the weights are
//! repacked at load, in place of the file's bytes (18 per 32 values, as in the file), into
//! groups of [`GROUP`] rows whose blocks are interleaved: per block, the group's sixteen f16
//! scales, then four 64-byte runs where run `t` holds, for each row `j` of the group, the
//! file's bytes `4t..4t+4` of that row's block (low nibbles: values `4t..4t+4`, high nibbles:
//! values `16+4t..16+4t+4`). One 32-bit lane per weight row: a broadcast of four activation
//! bytes meets sixteen rows' four weights in one `vpdpbusd`, and each output's whole-block
//! integer sum lands in its own lane, converted and scaled once per block.
//!
//! Float order, fixed per output element whatever the level, thread count or neighbours:
//! `acc = fma(d_w·d_a, Σ_{e<32}(n_e − 8)·q_a[e], acc)` over the blocks in order, from zero.
//! The integer sums are exact whichever instructions form them (unsigned nibble times signed
//! activation, minus `8·Σq_a`; no saturation: 15·127·2 < 2¹⁵), so the AVX-512 VNNI path
//! (sixteen rows per register), the AVX2 path (eight), the AMX path (a tile of eight panel
//! rows × sixteen weight rows per block, `tdpbsud` on the nibbles unpacked to bytes) and the
//! portable one give the same bits.

use half::f16;

use super::{Format, GroupOut, Job, Q8Panel, Q8Panels, Rows16Matrix, GROUP};
use crate::model::kernels::panel::PANEL;

/// Bytes of one GGUF Q4_0 block: f16 d, 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 18;
/// Bytes of one block of a group: the scales, then the nibbles.
const GROUP_BLOCK_BYTES: usize = GROUP * BLOCK_BYTES;
/// Offset of the nibbles in a group's block.
const NIBBLES: usize = 2 * GROUP;

/// The Q4_0 format of the interleaved-rows driver.
pub struct Q4_0;

/// A Q4_0 weight matrix `[n, k]` (n outputs, k inputs), repacked in interleaved groups of
/// [`GROUP`] rows; it holds 18 bytes per block, as in the file (plus the last group's
/// padding rows).
pub type Q4_0Rows16 = Rows16Matrix<Q4_0>;

/// A job of this format.
pub(crate) type Q4_0Job<'a> = Job<'a, Q8Panel<'a>>;

impl Format for Q4_0 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q4_0";
    const FILE_BLOCK_BYTES: usize = BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = GROUP_BLOCK_BYTES;

    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
        for t in 0..4 {
            dst[NIBBLES + 64 * t + 4 * lane..][..4].copy_from_slice(&src[2 + 4 * t..][..4]);
        }
    }

    /// `(n − 8)·d` per value (ggml's and candle's Q4_0 dequantization).
    fn dequantize(src: &[u8], lane: usize, o: &mut [f32]) {
        let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
        for t in 0..4 {
            for i in 0..4 {
                let byte = src[NIBBLES + 64 * t + 4 * lane + i];
                o[4 * t + i] = ((byte & 0x0F) as i32 - 8) as f32 * d;
                o[16 + 4 * t + i] = ((byte >> 4) as i32 - 8) as f32 * d;
            }
        }
    }

    fn portable(job: &Q4_0Job<'_>) -> GroupOut {
        std::array::from_fn(|lane| {
            std::array::from_fn(|r| {
                let mut acc = 0f32;
                for b in 0..job.nb {
                    let src = &job.group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                    let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
                    let (qa, da) = (&job.a.qs[b * PANEL + r], job.a.d[b * PANEL + r]);
                    let mut sum = 0i32;
                    for t in 0..4 {
                        for i in 0..4 {
                            let byte = src[NIBBLES + 64 * t + 4 * lane + i];
                            sum += ((byte & 0x0F) as i32 - 8) * qa[4 * t + i] as i32;
                            sum += ((byte >> 4) as i32 - 8) * qa[16 + 4 * t + i] as i32;
                        }
                    }
                    acc = (d * da).mul_add(sum as f32, acc);
                }
                acc
            })
        })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Q4_0Job<'_>) -> GroupOut {
        x86::group_avx2(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Q4_0Job<'_>) -> GroupOut {
        x86::group_avx512(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Q4_0Job<'_>) -> Option<GroupOut> {
        Some(x86::group_amx(tiles, job))
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q4_0_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q4_0_tests.rs"]
mod tests;
