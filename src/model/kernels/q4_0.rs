//! Q4_0 weights × f32 activations: each activation row quantized to Q8_0 (32-value blocks,
//! scale `d`; the values and scales of [`panel`]'s Q8_1 panels, as llama.cpp's CPU backend
//! quantizes them), each output `Σ_blocks d_w·d_a·Σ((n_w − 8)·q_a)`.
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
//! (sixteen rows per register), the AVX2 path (eight) and the portable one give the same bits.

use half::f16;

use super::panel::{self, PanelRef, Panels, BLOCK, PANEL};
use super::Isa;

/// Bytes of one GGUF Q4_0 block: f16 d, 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 18;
/// Weight rows interleaved per group (one per 32-bit lane of a 512-bit register).
pub const GROUP: usize = 16;
/// Bytes of one block of a group: the scales, then the nibbles.
const GROUP_BLOCK_BYTES: usize = GROUP * BLOCK_BYTES;
/// Offset of the nibbles in a group's block.
const NIBBLES: usize = 2 * GROUP;

/// A Q4_0 weight matrix `[n, k]` (n outputs, k inputs), repacked in interleaved groups of
/// [`GROUP`] rows (the last group padded with zero rows).
pub struct Q4_0Matrix {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl Q4_0Matrix {
    /// From GGUF Q4_0 bytes of a `[n, k]` tensor.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let blocks = n.checked_mul(k)? / BLOCK;
        if k == 0 || !k.is_multiple_of(BLOCK) || bytes.len() != blocks.checked_mul(BLOCK_BYTES)? {
            return None;
        }
        let nb = k / BLOCK;
        let mut data = vec![0u8; n.div_ceil(GROUP) * nb * GROUP_BLOCK_BYTES];
        for (j, row) in bytes.chunks_exact(nb * BLOCK_BYTES).enumerate() {
            let (g, lane) = (j / GROUP, j % GROUP);
            for (b, src) in row.chunks_exact(BLOCK_BYTES).enumerate() {
                let dst = &mut data[(g * nb + b) * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
                for t in 0..4 {
                    dst[NIBBLES + 64 * t + 4 * lane..][..4].copy_from_slice(&src[2 + 4 * t..][..4]);
                }
            }
        }
        Some(Self { n, k, data })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: 18 per block, as in the file (plus the last group's padding rows).
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

    /// Row `j` as f32, `(n − 8)·d` per value (ggml's and candle's Q4_0 dequantization).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let lane = j % GROUP;
        let blocks = self.group(j / GROUP).chunks_exact(GROUP_BLOCK_BYTES);
        for (o, src) in out.chunks_exact_mut(BLOCK).zip(blocks) {
            let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
            for t in 0..4 {
                for i in 0..4 {
                    let byte = src[NIBBLES + 64 * t + 4 * lane + i];
                    o[4 * t + i] = ((byte & 0x0F) as i32 - 8) as f32 * d;
                    o[16 + 4 * t + i] = ((byte >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
    }

    /// Group `g`'s blocks.
    fn group(&self, g: usize) -> &[u8] {
        let len = (self.k / BLOCK) * GROUP_BLOCK_BYTES;
        &self.data[g * len..][..len]
    }
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

impl super::OwnMatrix for Q4_0Matrix {
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
#[path = "q4_0_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q4_0_tests.rs"]
mod tests;
