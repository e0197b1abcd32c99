//! Signed 8-bit block weights × f32 activations: GGUF Q5_0 (decoded at load to −16..15) and
//! Q8_0. Each activation row is quantized to Q8_0 (32-value blocks, scale `d`; [`panel`]'s
//! panels, as llama.cpp's CPU backend quantizes them), and each output is
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
//! register), the AVX2 path (eight) and the portable one give the same bits.

use half::f16;

use super::panel::{self, PanelRef, Panels, BLOCK, PANEL};
use super::Isa;

/// Bytes of one GGUF Q5_0 block: f16 d, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_0_BLOCK_BYTES: usize = 22;
/// Bytes of one GGUF Q8_0 block: f16 d, 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Weight rows interleaved per group (one per 32-bit lane of a 512-bit register).
pub const GROUP: usize = 16;
/// Bytes of one block of a group: the scales, then the values.
const GROUP_BLOCK_BYTES: usize = GROUP * Q8_0_BLOCK_BYTES;
/// Offset of the values in a group's block.
const VALUES: usize = 2 * GROUP;

/// A weight matrix `[n, k]` (n outputs, k inputs) of signed 8-bit blocks with f16 scales,
/// repacked in interleaved groups of [`GROUP`] rows (the last group padded with zero rows).
pub struct Int8Matrix {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl Int8Matrix {
    /// From GGUF Q5_0 bytes of a `[n, k]` tensor.
    pub fn from_q5_0(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        Self::repack(bytes, n, k, Q5_0_BLOCK_BYTES, |b, q| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let nibbles = &b[6..22];
            for j in 0..16 {
                let lo = (nibbles[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (nibbles[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                q[j] = lo.wrapping_sub(16);
                q[j + 16] = hi.wrapping_sub(16);
            }
        })
    }

    /// From GGUF Q8_0 bytes of a `[n, k]` tensor.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        Self::repack(bytes, n, k, Q8_0_BLOCK_BYTES, |b, q| {
            q.copy_from_slice(&b[2..34])
        })
    }

    /// Interleaves the rows of `bytes` (blocks of `block_bytes`, f16 scale first; `values`
    /// writes a block's 32 signed values as bytes).
    fn repack(
        bytes: &[u8],
        n: usize,
        k: usize,
        block_bytes: usize,
        values: impl Fn(&[u8], &mut [u8; 32]) + Sync,
    ) -> Option<Self> {
        use rayon::prelude::*;
        let blocks = n.checked_mul(k)? / BLOCK;
        if k == 0 || !k.is_multiple_of(BLOCK) || bytes.len() != blocks.checked_mul(block_bytes)? {
            return None;
        }
        let nb = k / BLOCK;
        let mut data = vec![0u8; n.div_ceil(GROUP) * nb * GROUP_BLOCK_BYTES];
        data.par_chunks_mut(nb * GROUP_BLOCK_BYTES)
            .enumerate()
            .for_each(|(g, group)| {
                for lane in 0..GROUP.min(n - g * GROUP) {
                    let row = &bytes[(g * GROUP + lane) * nb * block_bytes..][..nb * block_bytes];
                    for (b, src) in row.chunks_exact(block_bytes).enumerate() {
                        let dst = &mut group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                        dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
                        let mut q = [0u8; 32];
                        values(src, &mut q);
                        for (t, four) in q.chunks_exact(4).enumerate() {
                            dst[VALUES + 64 * t + 4 * lane..][..4].copy_from_slice(four);
                        }
                    }
                }
            });
        Some(Self { n, k, data })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: 34 per block (plus the last group's padding rows).
    pub fn storage_bytes(&self) -> usize {
        self.data.len()
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(x, m, super::isa())
    }

    /// [`Self::matmul`] at level `isa` (capped to this process's): every level gives the same
    /// bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), m * k, "activation shape");
        let isa = isa.min(super::isa());
        let a = Panels::quantize(x, m, k);
        let sums = panel::block_sums(&a, m);
        let per_panel = (k / BLOCK) * PANEL;
        panel::drive(m, n, GROUP, |p, j, out| {
            let job = Job {
                group: self.group(j / GROUP),
                nb: k / BLOCK,
                a: a.panel(p),
                sums: &sums[p * per_panel..][..per_panel],
            };
            let all = group_at(&job, isa);
            out.copy_from_slice(&all[..out.len()]);
        })
    }

    /// Row `j` as f32, `d·q` per value: the same numbers as ggml's (and candle's) Q5_0 and
    /// Q8_0 dequantization, so a tied embedding can be looked up here.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let lane = j % GROUP;
        let blocks = self.group(j / GROUP).chunks_exact(GROUP_BLOCK_BYTES);
        for (o, src) in out.chunks_exact_mut(BLOCK).zip(blocks) {
            let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
            for (e, o) in o.iter_mut().enumerate() {
                *o = weight(src, lane, e) as f32 * d;
            }
        }
    }

    /// Group `g`'s blocks.
    fn group(&self, g: usize) -> &[u8] {
        let len = (self.k / BLOCK) * GROUP_BLOCK_BYTES;
        &self.data[g * len..][..len]
    }
}

/// Value `e` of lane `lane` in a group's block.
fn weight(src: &[u8], lane: usize, e: usize) -> i8 {
    src[VALUES + 64 * (e / 4) + 4 * lane + e % 4] as i8
}

/// One group of weight rows against one panel.
pub(crate) struct Job<'a> {
    /// The group's interleaved blocks.
    pub group: &'a [u8],
    /// Blocks per row.
    pub nb: usize,
    pub a: PanelRef<'a>,
    /// `Σ q_a` per block and panel row (`b·PANEL + r`).
    pub sums: &'a [i32],
}

/// The outputs `[weight row of the group][panel row]` of a job at level `isa`.
fn group_at(job: &Job<'_>, isa: Isa) -> [[f32; PANEL]; GROUP] {
    assert!(
        job.group.len() == job.nb * GROUP_BLOCK_BYTES
            && job.a.qs.len() >= job.nb * PANEL
            && job.a.d.len() >= job.nb * PANEL
            && job.sums.len() >= job.nb * PANEL
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
                let sum: i32 = (0..BLOCK)
                    .map(|e| weight(src, lane, e) as i32 * qa[e] as i32)
                    .sum();
                acc = (d * da).mul_add(sum as f32, acc);
            }
            acc
        })
    })
}

impl super::OwnMatrix for Int8Matrix {
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
#[path = "int8_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "int8_tests.rs"]
mod tests;
