//! K-quant weights (GGUF Q4_K, Q5_K, Q6_K) × f32 activations, computed as llama.cpp's CPU
//! backend does: each activation row is quantized to Q8_K ([`q8k`]: 256-value super-blocks, an
//! f32 scale, 16 sums of 16 values), and each output is, per super-block, an integer dot
//! product of every 32- (Q4_K, Q5_K) or 16-value (Q6_K) sub-block times its integer scale,
//! the mins (Q4_K, Q5_K) or the −32 offset (Q6_K) through the activation sums, then one
//! `d_w·d_a` float product per super-block.
//!
//! Why: these are the types of the Q4_K_M / Q5_K_M / Q6_K files people evaluate. candle
//! computes them either one row at a time or, on x86, from a repacked copy of the weights
//! (f32 scales per sub-block, built at the first product and kept next to the original: about
//! twice the file's bytes in memory). Here a micro-kernel decodes each weight super-block once
//! for a panel of eight activation rows, four weight rows per call so that a super-block of
//! the panel's activations is reused from L1 ([`super::panel::drive`] blocks and threads the
//! work), while the weights stay within 3% of the file's bytes: 4-, 5- and 6-bit values stay
//! packed as in the file, only Q4_K/Q5_K's 6-bit scales and mins are unpacked to bytes
//! (Q4_K 148 bytes per super-block for the file's 144, Q5_K 180 for 176, Q6_K 210 as is).
//!
//! Float order, fixed per output element and shared by the portable, AVX2 and AVX-512 paths
//! (so all give the same bits): the integer sums of a super-block are exact (no i16
//! saturation can occur in these ranges), then, over the super-blocks in order,
//! `acc = fma(d_w·d_a, sum as f32, acc)`, and for Q4_K/Q5_K
//! `acc_min = fma(dmin_w·d_a, mins as f32, acc_min)`; the output is `acc − acc_min`. The SIMD
//! paths run these float operations for the eight rows of a panel as one vector each. AVX2
//! forms the sums as ggml does (`maddubs`, then `madd` with the scales); AVX-512 with VNNI
//! (`vpdpbusd` into sums of four, packed to i16, `vpdpwssd` with the scales), three multiplies
//! per 128 values of a row instead of four.

pub mod q4k;
pub mod q5k;
pub mod q6k;
pub mod q8k;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::panel::{self, PANEL};
use super::Isa;
use q8k::{Q8KPanel, Q8KPanels};

/// Values per super-block of every K-quant type and of Q8_K.
pub const QK_K: usize = 256;

/// One weight super-block of a K-quant format as held in memory, and the format's kernels.
pub trait SuperBlock: Sized + Send + Sync {
    /// Bytes of one super-block in a GGUF file.
    const FILE_BYTES: usize;

    /// From the super-block's bytes in the file (`FILE_BYTES` of them).
    fn decode(file: &[u8]) -> Self;

    /// The 256 values as f32: the same numbers, in the same float operations, as ggml's (and
    /// candle's) dequantization.
    fn dequantize(&self, out: &mut [f32]);

    /// The outputs of weight rows `0..out.len()` (at most [`GROUP`]; `blocks` holds their
    /// super-blocks, `nb` per row) for the eight activation rows of a panel, computed by the
    /// `isa` path (capped at what [`super::isa`] allows; every path gives the same bits).
    fn panel_rows(blocks: &[Self], nb: usize, a: Q8KPanel<'_>, out: &mut [[f32; PANEL]], isa: Isa);
}

/// Weight rows per micro-kernel call: each super-block of a panel's activations (2 KiB) is
/// loaded into L1 once for this many weight rows (one row per call streamed the whole panel,
/// 64 KiB at k = 8192, from L2 for every weight row).
pub const GROUP: usize = 4;

/// A K-quant weight matrix `[n, k]` (n outputs, k inputs; k a multiple of [`QK_K`]).
pub struct KQuantMatrix<B: SuperBlock> {
    n: usize,
    k: usize,
    blocks: Vec<B>,
}

impl<B: SuperBlock> KQuantMatrix<B> {
    /// From the GGUF bytes of a `[n, k]` tensor; `None` unless `k` is a multiple of 256 (ggml
    /// never writes K-quants otherwise) and `bytes` has the size of `n·k/256` super-blocks.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || !k.is_multiple_of(QK_K) || bytes.len() != n * k / QK_K * B::FILE_BYTES {
            return None;
        }
        let blocks = bytes.chunks_exact(B::FILE_BYTES).map(B::decode).collect();
        Some(Self { n, k, blocks })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held.
    pub fn storage_bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<B>()
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, super::isa())
    }

    /// [`Self::matmul`] by the `isa` path (capped at what the CPU allows).
    pub fn matmul_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        self.matmul_prepared(&Q8KPanels::quantize(x, m, self.k), m, isa)
    }

    /// The product of `m` rows of activations already in Q8_K.
    fn matmul_prepared(&self, a: &Q8KPanels, m: usize, isa: Isa) -> Vec<f32> {
        let nb = self.k / QK_K;
        panel::drive(m, self.n, GROUP, |p, j, out| {
            let mut res = [[0f32; PANEL]; GROUP];
            let res = &mut res[..out.width()];
            let blocks = &self.blocks[j * nb..(j + res.len()) * nb];
            B::panel_rows(blocks, nb, a.panel(p), res, isa);
            for r in 0..out.live() {
                let row: [f32; GROUP] = std::array::from_fn(|c| res.get(c).map_or(0.0, |c| c[r]));
                out.set_row(r, &row);
            }
        })
    }

    /// Row `j` as f32 (ggml's and candle's dequantization).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        for (blk, out) in self.row(j).iter().zip(out.chunks_exact_mut(QK_K)) {
            blk.dequantize(out);
        }
    }

    fn row(&self, j: usize) -> &[B] {
        let nb = self.k / QK_K;
        &self.blocks[j * nb..(j + 1) * nb]
    }
}

impl<B: SuperBlock> super::OwnMatrix for KQuantMatrix<B> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn storage_bytes(&self) -> usize {
        self.storage_bytes()
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul(x, m)
    }

    fn matmul_shared(&self, input: &super::SharedInput<'_>) -> Vec<f32> {
        let a = input.q8k(self.k);
        self.matmul_prepared(a, input.rows(), super::isa())
    }

    fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        self.dequantize_row(j, out)
    }
}

/// The path to run: `wanted`, capped at what this CPU allows.
pub(crate) fn path(wanted: Isa) -> Isa {
    wanted.min(super::isa())
}

/// The portable path of [`SuperBlock::panel_rows`], given the one-row definition.
pub(crate) fn rows_portable<B>(
    blocks: &[B],
    nb: usize,
    a: Q8KPanel<'_>,
    out: &mut [[f32; PANEL]],
    row: fn(&[B], Q8KPanel<'_>) -> [f32; PANEL],
) {
    for (o, blocks) in out.iter_mut().zip(blocks.chunks_exact(nb)) {
        *o = row(blocks, a);
    }
}

/// The scales and mins of Q4_K/Q5_K's eight 32-value sub-blocks, unpacked from the 12 bytes
/// that hold them as 6-bit numbers (ggml's `get_scale_min_k4` layout): sub-blocks 0–3 in the
/// low 6 bits of bytes 0–3 (scales) and 4–7 (mins); sub-blocks 4–7 in the nibbles of bytes
/// 8–11 with their top two bits in the top bits of bytes 0–7.
pub(crate) fn unpack_scales_mins(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for s in 0..4 {
        scales[s] = packed[s] & 63;
        mins[s] = packed[s + 4] & 63;
        scales[s + 4] = (packed[s + 8] & 0x0F) | ((packed[s] >> 6) << 4);
        mins[s + 4] = (packed[s + 8] >> 4) | ((packed[s + 4] >> 6) << 4);
    }
    (scales, mins)
}
