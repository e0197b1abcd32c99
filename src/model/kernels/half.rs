//! F16 and BF16 weight matrices kept 16-bit (the file's bytes, 2 per weight) and multiplied
//! as llama.cpp's CPU backend multiplies them.
//!
//! Why: candle's quantized matmul widens F16/BF16 weights to f32 at load, so a native
//! evaluation held twice the file's bytes (an 8B BF16 checkpoint: 32 GB instead of 16) and
//! streamed twice the bytes through the caches; a Llama-3.2-1B-shaped F16 model ran at 0.52×
//! llama.cpp's speed with 2× its memory. Here each weight is widened in registers, once per
//! eight activation rows.
//!
//! Arithmetic: llama.cpp's `vec_dot_type` for F16 is F16 and for BF16 is BF16, so the f32
//! activations are first rounded (to nearest even) to the weights' type; the products of two
//! such values are exact in f32. Each output element is then computed in one fixed order,
//! whatever the instruction set, thread count or position of its row in the batch:
//! eight lanes, lane `l` accumulating `fma(w[8c+l], x[8c+l], acc_l)` for `c = 0, 1, …`, then
//! ggml's `hsum_float_8` order `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, then the last `k mod 8`
//! products added one at a time. The AVX2 path keeps one lane set per 256-bit register, the
//! AVX-512 path two activation rows per 512-bit register (each half is one row's eight lanes),
//! and the portable path is the scalar definition: all three give the same bits.
//!
//! Layout: activations are rounded once per matmul and packed in panels of [`PANEL`] rows,
//! chunk-major (`[chunk][row][8 lanes]`, then the `k mod 8` tail values row by row), so a
//! micro-kernel reads the eight rows' values of one chunk from one 256-byte line run.

use ::half::f16;

use super::Isa;

pub use super::half_driver::PANEL;
use super::half_driver::{accumulate_lanes, ChunkPanel, ChunkPanels, Lanes, PanelKernel, LANES};

/// Which 16-bit float the weights (and the rounded activations) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfType {
    /// IEEE binary16.
    F16,
    /// bfloat16: the top half of an f32.
    Bf16,
}

impl HalfType {
    /// The value of `bits` as f32 (exact).
    pub fn widen(self, bits: u16) -> f32 {
        match self {
            HalfType::F16 => f16::from_bits(bits).to_f32(),
            HalfType::Bf16 => f32::from_bits((bits as u32) << 16),
        }
    }

    /// `x` rounded to nearest even in this type, as ggml's `fp32_to_fp16` / `fp32_to_bf16`
    /// (a NaN stays a quiet NaN), returned as its exact f32 value.
    pub fn round(self, x: f32) -> f32 {
        match self {
            HalfType::F16 => f16::from_f32(x).to_f32(),
            HalfType::Bf16 => f32::from_bits(round_to_bf16_bits(x.to_bits())),
        }
    }
}

/// The f32 bits of `bits` rounded to bf16 (nearest even), low half zero; NaNs made quiet.
pub(crate) fn round_to_bf16_bits(bits: u32) -> u32 {
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return (bits & 0xffff_0000) | 0x0040_0000;
    }
    let odd = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + odd)) & 0xffff_0000
}

/// A weight matrix `[n, k]` of F16 or BF16 values, held as the file's 16-bit values.
pub struct HalfMatrix {
    kind: HalfType,
    n: usize,
    k: usize,
    bits: Vec<u16>,
}

impl HalfMatrix {
    /// From the little-endian bytes of a `[n, k]` GGUF F16 or BF16 tensor.
    pub fn from_bytes(kind: HalfType, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)?.checked_mul(2)? != bytes.len() {
            return None;
        }
        let bits = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        Some(Self { kind, n, k, bits })
    }

    pub fn kind(&self) -> HalfType {
        self.kind
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: two per weight.
    pub fn storage_bytes(&self) -> usize {
        self.bits.len() * 2
    }

    /// Row `j` widened to f32: exactly ggml's (and candle's) dequantization.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        for (o, &b) in out.iter_mut().zip(self.row(j)) {
            *o = self.kind.widen(b);
        }
    }

    fn row(&self, j: usize) -> &[u16] {
        &self.bits[j * self.k..(j + 1) * self.k]
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`, at the level [`isa`]
    /// allows.
    ///
    /// [`isa`]: super::isa
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(x, m, super::isa())
    }

    /// [`Self::matmul`] at a given level (capped to what this CPU runs): every level gives the
    /// same bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        let isa = isa.min(cpu_level());
        assert_eq!(x.len(), m * self.k, "activation shape");
        let a = pack(self.kind, x, m, self.k, isa);
        super::half_driver::matmul(self, &a, m, isa)
    }
}

impl PanelKernel for HalfMatrix {
    type Weight = u16;
    type Act = f32;
    const CHUNK: usize = LANES;
    /// 16 KiB of a panel's (f32) rows: L1.
    const K_SLICE: usize = 512;

    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn rows(&self, rows: std::ops::Range<usize>) -> &[u16] {
        &self.bits[rows.start * self.k..rows.end * self.k]
    }

    fn accumulate(&self, job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
        accumulate(self.kind, job, isa, acc)
    }

    fn tail_step(&self, w: u16, x: f32, sum: f32) -> f32 {
        self.kind.widen(w).mul_add(x, sum)
    }
}

/// One pass of weight rows over a slice of a panel.
pub(crate) type Job<'a> = super::half_driver::Job<'a, u16, f32>;

/// Adds the job's chunks (weights of type `kind`) into `acc[c][r·8 + l]` (weight row `c`,
/// panel row `r`, lane `l`) at level `isa`: every level performs the same fused multiply-adds
/// in the same order.
fn accumulate(kind: HalfType, job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
    job.check(acc, LANES);
    #[cfg(target_arch = "x86_64")]
    {
        let bf16 = kind == HalfType::Bf16;
        // SAFETY: `isa` was capped by what this CPU executes (AVX-512 F/BW/VL on top of
        // AVX2 + FMA + F16C for `Avx512`); the lengths were checked above.
        if isa >= Isa::Avx512 {
            unsafe { x86::avx512::accumulate(bf16, job, acc) };
            return;
        }
        if isa >= Isa::Avx2 {
            unsafe { x86::avx2::accumulate(bf16, job, acc) };
            return;
        }
    }
    let _ = isa;
    accumulate_portable(kind, job, acc);
}

/// The definition, one lane at a time.
pub(crate) fn accumulate_portable(kind: HalfType, job: &Job<'_>, acc: &mut [Lanes]) {
    accumulate_lanes(job, LANES, acc, |w, x, lanes| {
        for ((a, &w), &x) in lanes.iter_mut().zip(w).zip(x) {
            *a = kind.widen(w).mul_add(x, *a);
        }
    });
}

/// The highest level this CPU executes for this kernel, whatever `PPL_ISA` says: the float
/// kernels' level, capped at AVX-512 (this kernel has no AVX-512 BF16 path).
fn cpu_level() -> Isa {
    super::half_driver::cpu_level().min(Isa::Avx512)
}

super::own_matrix_from_inherent!(HalfMatrix);

/// Activations rounded to the weights' type (held as their exact f32 values), packed in
/// panels of [`PANEL`] rows.
pub type Panels = ChunkPanels<f32>;
/// One panel of them.
pub type PanelRef<'a> = ChunkPanel<'a, f32>;

/// Rounds and packs `x [m, k]`, with SIMD where `isa` allows (the same bits).
pub fn pack(kind: HalfType, x: &[f32], m: usize, k: usize, isa: Isa) -> Panels {
    Panels::pack(
        x,
        (m, k, LANES),
        |src, dst| round8(kind, src, dst, isa),
        |v| kind.round(v),
    )
}

/// Eight values rounded to `kind`.
fn round8(kind: HalfType, src: &[f32], dst: &mut [f32], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx2 {
            // SAFETY: AVX2 + F16C are present (`isa` is capped by detection); both slices
            // hold eight values (asserted inside).
            unsafe { x86::avx2::round8(kind == HalfType::Bf16, src, dst) };
            return;
        }
    }
    let _ = isa;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = kind.round(s);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "half_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "half_tests.rs"]
mod tests;
