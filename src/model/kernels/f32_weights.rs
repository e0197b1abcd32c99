//! F32 weight matrices — an F32 file's in `native` precision, used in place from the model
//! file's map, and every file's dequantized weights in `--precision f32` — multiplied in
//! register tiles of eight activation rows on the shared driver ([`super::half_driver`]).
//!
//! Why: an F32 GGUF's matrices went through candle's f32 gemm, which ran the SmolLM2 F32
//! export at 0.84× llama.cpp's tokens/s; candle also copied every matrix out of the map.
//! Here the file's values are read where they lie (no copy, no new memory) and each weight
//! loaded into a register serves eight activation rows.
//!
//! Arithmetic: the activations are used as they are (f32, as llama.cpp's `vec_dot_type` for
//! F32). Each output element is computed in one fixed order, whatever the instruction set,
//! thread count or position of its row in the batch: eight lanes, lane `l` accumulating
//! `fma(w[8c+l], x[8c+l], acc_l)` for `c = 0, 1, …`, then ggml's `hsum_float_8` order
//! `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, then the last `k mod 8` products added one at a
//! time by fused multiply-adds. The AVX2 path keeps one lane set per 256-bit register, the
//! AVX-512 path two activation rows per 512-bit register, the portable path is the scalar
//! definition (`f32::mul_add`): all three give the same bits.
//!
//! Layout: the weights as the file's row-major f32 values; the activations packed once per
//! matmul in panels of [`PANEL`] rows, chunk-major (`[chunk][row][8 lanes]`, then the `k mod 8`
//! tail values row by row).

use super::Isa;
use crate::model::mapped::MappedBytes;

pub use super::half_driver::PANEL;
use super::half_driver::{accumulate_lanes, ChunkPanel, ChunkPanels, Lanes, PanelKernel, LANES};

/// A weight matrix `[n, k]` of f32 values.
pub struct F32Matrix {
    n: usize,
    k: usize,
    values: Values,
}

/// Where the weights lie: in the model file's map, used in place, or in a copy of ours (bytes
/// not in a map, or a map not 4-aligned).
enum Values {
    Mapped(MappedBytes),
    Owned(Vec<f32>),
}

impl Values {
    fn get(&self) -> &[f32] {
        match self {
            // `from_mapped` only keeps maps that read as f32.
            Values::Mapped(m) => m.as_f32().unwrap_or_default(),
            Values::Owned(v) => v,
        }
    }
}

impl F32Matrix {
    /// From the little-endian bytes of a `[n, k]` GGUF F32 tensor (copied).
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)?.checked_mul(4)? != bytes.len() {
            return None;
        }
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Some(Self {
            n,
            k,
            values: Values::Owned(values),
        })
    }

    /// From `[n, k]` values (dequantized weights: `--precision f32`).
    pub fn from_values(values: Vec<f32>, n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)? != values.len() {
            return None;
        }
        Some(Self {
            n,
            k,
            values: Values::Owned(values),
        })
    }

    /// From a tensor still in the file's map: used in place (no copy) when the map reads as
    /// f32, else as [`Self::from_bytes`].
    pub fn from_mapped(mapped: &MappedBytes, n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)?.checked_mul(4)? != mapped.bytes().len() {
            return None;
        }
        if mapped.as_f32().is_none() {
            return Self::from_bytes(mapped.bytes(), n, k);
        }
        Some(Self {
            n,
            k,
            values: Values::Mapped(mapped.keep()),
        })
    }

    /// Whether the weights are used where they lie in the model file's map.
    pub fn is_in_place(&self) -> bool {
        matches!(self.values, Values::Mapped(_))
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: four per weight.
    pub fn storage_bytes(&self) -> usize {
        self.values.get().len() * 4
    }

    /// Row `j` as stored.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        out.copy_from_slice(&self.values.get()[j * self.k..(j + 1) * self.k]);
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`, at the level
    /// [`super::isa`] allows.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(x, m, super::isa())
    }

    /// [`Self::matmul`] at a given level (capped to what this CPU runs): every level gives the
    /// same bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        let isa = isa.min(cpu_level());
        assert_eq!(x.len(), m * self.k, "activation shape");
        let a = pack(x, m, self.k);
        super::half_driver::matmul(self, &a, m, isa)
    }
}

impl PanelKernel for F32Matrix {
    type Weight = f32;
    type Act = f32;
    const CHUNK: usize = LANES;
    /// 32 KiB of a panel's rows, in a 48 KiB L1. 512 (16 KiB) cut SmolLM2's 576-value rows
    /// into a pass of 64 chunks and one of 8, the short one spending as much on its 24 sums'
    /// loads and stores as on arithmetic; 1024 ran its 576-wide matmuls 1.05–1.09× faster and
    /// the 1536-wide one 0.97× (best of 40 runs each, alternating; the order of each lane's
    /// additions is the same either way).
    const K_SLICE: usize = 1024;

    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn rows(&self, rows: std::ops::Range<usize>) -> &[f32] {
        &self.values.get()[rows.start * self.k..rows.end * self.k]
    }

    fn accumulate(&self, job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
        accumulate(job, isa, acc)
    }

    fn tail_step(&self, w: f32, x: f32, sum: f32) -> f32 {
        w.mul_add(x, sum)
    }
}

/// One pass of weight rows over a slice of a panel.
pub(crate) type Job<'a> = super::half_driver::Job<'a, f32, f32>;

/// Adds the job's chunks into `acc[c][r·8 + l]` (weight row `c`, panel row `r`, lane `l`) at
/// level `isa`: every level performs the same fused multiply-adds in the same order.
fn accumulate(job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
    job.check(acc, LANES);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `isa` was capped by what this CPU executes (see `cpu_level`); the lengths
        // were checked above.
        if isa >= Isa::Avx512 {
            unsafe { x86::avx512::accumulate(job, acc) };
            return;
        }
        if isa >= Isa::Avx2 {
            unsafe { x86::avx2::accumulate(job, acc) };
            return;
        }
    }
    let _ = isa;
    accumulate_portable(job, acc);
}

/// The definition, one lane at a time.
pub(crate) fn accumulate_portable(job: &Job<'_>, acc: &mut [Lanes]) {
    accumulate_lanes(job, LANES, acc, |w, x, lanes| {
        for ((a, &w), &x) in lanes.iter_mut().zip(w).zip(x) {
            *a = w.mul_add(x, *a);
        }
    });
}

/// The highest level this CPU executes for this kernel, whatever `PPL_ISA` says: the float
/// kernels' level, capped at AVX-512 (this kernel has no AVX-512 BF16 path).
pub(crate) fn cpu_level() -> Isa {
    super::half_driver::cpu_level().min(Isa::Avx512)
}

super::own_matrix_from_inherent!(F32Matrix);

/// Activations packed in panels of [`PANEL`] rows (the values unchanged).
pub type Panels = ChunkPanels<f32>;
/// One panel of them.
pub type PanelRef<'a> = ChunkPanel<'a, f32>;

/// Packs `x [m, k]`.
pub fn pack(x: &[f32], m: usize, k: usize) -> Panels {
    Panels::pack(x, (m, k, LANES), |src, dst| dst.copy_from_slice(src), |v| v)
}

#[cfg(target_arch = "x86_64")]
#[path = "f32_weights_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "f32_weights_tests.rs"]
mod tests;
