//! BF16 weight matrices kept 16-bit and multiplied in the order of AVX-512 BF16's
//! `vdpbf16ps`, so that CPUs that have it (as llama.cpp uses it) compute two products per
//! lane per instruction, and every other level computes the very same bits.
//!
//! Why: widening BF16 weights to f32 and using f32 FMAs (the [`super::half`] kernel) does 16
//! products per 512-bit instruction; `vdpbf16ps` does 32 and needs no widening. A
//! Llama-3.2-1B-shaped BF16 model ran at 0.46× llama.cpp's speed with the widening kernel.
//!
//! Arithmetic: the activations are rounded to BF16 (nearest even, as llama.cpp's
//! `vec_dot_type` for BF16). Each output element is computed in one fixed order whatever the
//! level, thread count or position of its row in the batch: eight lanes, lane `l` taking the
//! values `16c + 2l` (even) and `16c + 2l + 1` (odd) of each chunk `c = 0, 1, …` as
//! `acc_l = fma(w_even, x_even, fma(w_odd, x_odd, acc_l))` (odd first, as `vdpbf16ps` does);
//! then ggml's `hsum_float_8` order over the lanes, then the last `k mod 16` products added
//! one at a time.
//!
//! `vdpbf16ps` treats denormal inputs (accumulator included) as zero and flushes denormal
//! results to zero; f32 FMAs do not. So that neither ever happens, weights below 2⁻⁶⁴ and
//! rounded activations below 2⁻⁴⁸ in magnitude are held as (signed) zero: every nonzero
//! product is then a multiple of 2⁻¹²⁶ (the weight's last place is at least 2⁻⁷¹, the
//! activation's at least 2⁻⁵⁵), so is every sum and every rounded sum, and no value is ever
//! denormal. (No real checkpoint holds such weights; such activations contribute below f32's
//! rounding of any sum they meet.) The products of two BF16 values are exact in f32, so the
//! hardware's two fused steps and the FMAs of the other levels are the same operations.
//!
//! Layout: the weights as the file's BF16 values, row-major. The activations, rounded once
//! per matmul, in panels of [`PANEL`] rows, chunk-major (`[chunk][row][16 values]`, then the
//! `k mod 16` tail values row by row), so that two panel rows' chunk is one 64-byte load.

use rayon::prelude::*;

use super::half::round_to_bf16_bits;
use super::Isa;
use crate::model::mapped::MappedBytes;

pub(crate) use super::half_driver::cpu_level;
pub use super::half_driver::PANEL;
use super::half_driver::{accumulate_lanes, ChunkPanel, ChunkPanels, Lanes, PanelKernel, LANES};
/// Values per chunk: two per lane.
const CHUNK: usize = 2 * LANES;
/// Smallest biased exponent of a weight kept (2⁻⁶⁴); smaller ones are held as zero.
const WEIGHT_MIN_EXP: u16 = 127 - 64;
/// Smallest biased exponent of a rounded activation kept (2⁻⁴⁸).
const ACTIVATION_MIN_EXP: u16 = 127 - 48;

/// `bits` (BF16) with magnitudes below `2^(min_exp − 127)` replaced by a zero of their sign.
#[inline]
pub(crate) fn flush_below(bits: u16, min_exp: u16) -> u16 {
    let keep = ((bits >> 7) & 0xff >= min_exp) as u16;
    // All ones when kept, the sign bit alone when not.
    bits & (0x8000 | keep.wrapping_neg())
}

/// The BF16 bits an activation is multiplied as: rounded to nearest even (a NaN made quiet),
/// then flushed below 2⁻⁴⁸.
pub(crate) fn activation_bits(x: f32) -> u16 {
    flush_below(
        (round_to_bf16_bits(x.to_bits()) >> 16) as u16,
        ACTIVATION_MIN_EXP,
    )
}

fn widen(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// A weight matrix `[n, k]` of BF16 values, held 16-bit (flushed below 2⁻⁶⁴).
pub struct Bf16Matrix {
    n: usize,
    k: usize,
    bits: Bits,
    /// The same weights in the tile layout, where the BF16 kernel multiplies on the tile
    /// unit ([`super::bf16_tiles`]); the row-major `bits` then serve only the lower levels
    /// (tests), and their mapped pages are not kept resident.
    tiles: Option<tiles::TileWeights>,
}

/// Where the weights lie: in the model file's map, used in place (the file's bytes needed no
/// flushing), or in a copy of ours.
enum Bits {
    Mapped(MappedBytes),
    Owned(Vec<u16>),
}

impl Bits {
    fn get(&self) -> &[u16] {
        match self {
            // `from_mapped` only keeps maps that read as u16.
            Bits::Mapped(m) => m.as_u16().unwrap_or_default(),
            Bits::Owned(v) => v,
        }
    }
}

/// Values flushed or scanned per parallel task at load.
const LOAD_SPAN: usize = 1 << 16;

impl Bf16Matrix {
    /// From the little-endian bytes of a `[n, k]` GGUF BF16 tensor (copied).
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)?.checked_mul(2)? != bytes.len() {
            return None;
        }
        // In parallel and branch-free: at load, this copy of a billion-weight model's bytes
        // was a tenth of a one-chunk evaluation.
        let mut bits = vec![0u16; n * k];
        bits.par_chunks_mut(LOAD_SPAN)
            .zip(bytes.par_chunks(2 * LOAD_SPAN))
            .for_each(|(dst, src)| {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = flush_below(u16::from_le_bytes([s[0], s[1]]), WEIGHT_MIN_EXP);
                }
            });
        let tiles = super::bf16_tiles().then(|| tiles::TileWeights::new(&bits, n, k));
        Some(Self {
            n,
            k,
            bits: Bits::Owned(bits),
            tiles,
        })
    }

    /// From a tensor still in the file's map: used in place when its values need no flushing
    /// (every real checkpoint: one parallel read of the bytes, no copy, no new memory), else
    /// as [`Self::from_bytes`].
    pub fn from_mapped(mapped: &MappedBytes, n: usize, k: usize) -> Option<Self> {
        if k == 0 || n.checked_mul(k)?.checked_mul(2)? != mapped.bytes().len() {
            return None;
        }
        let Some(values) = mapped.as_u16() else {
            return Self::from_bytes(mapped.bytes(), n, k);
        };
        let needs_flush = values.par_chunks(LOAD_SPAN).any(|span| {
            span.iter()
                .fold(false, |any, &b| any | (flush_below(b, WEIGHT_MIN_EXP) != b))
        });
        if needs_flush {
            return Self::from_bytes(mapped.bytes(), n, k);
        }
        if super::bf16_tiles() {
            // The tile layout is a copy: the map is not kept resident (the loader drops its
            // pages; a lower level reading them faults them back in).
            return Some(Self {
                n,
                k,
                tiles: Some(tiles::TileWeights::new(values, n, k)),
                bits: Bits::Mapped(mapped.clone()),
            });
        }
        Some(Self {
            n,
            k,
            bits: Bits::Mapped(mapped.keep()),
            tiles: None,
        })
    }

    /// Whether the weights are used where they lie in the model file's map.
    pub fn is_in_place(&self) -> bool {
        matches!(self.bits, Bits::Mapped(_)) && self.tiles.is_none()
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: two per weight (the tile layout's, where it is used).
    pub fn storage_bytes(&self) -> usize {
        match &self.tiles {
            Some(t) => t.storage_bytes(),
            None => self.bits.get().len() * 2,
        }
    }

    /// Row `j` widened to f32: ggml's dequantization (of the weights as held).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        if let Some(t) = &self.tiles {
            for (e, o) in out[..self.k].iter_mut().enumerate() {
                *o = widen(t.value(j, e));
            }
            return;
        }
        for (o, &b) in out
            .iter_mut()
            .zip(&self.bits.get()[j * self.k..(j + 1) * self.k])
        {
            *o = widen(b);
        }
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`, at the level
    /// [`super::isa`] allows — with `vdpbf16ps` only where it is the faster of the two
    /// AVX-512 paths here ([`vdpbf16ps_pays`]; both give the same bits).
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let isa = super::isa();
        let on_tiles = isa >= Isa::Amx && self.tiles.is_some();
        if !on_tiles && isa >= Isa::Avx512Bf16 && !vdpbf16ps_pays() {
            return self.matmul_at(x, m, Isa::Avx512);
        }
        self.matmul_at(x, m, isa)
    }

    /// [`Self::matmul`] at a given level (capped to what this CPU runs): every level gives the
    /// same bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), true) = (&self.tiles, isa >= Isa::Amx) {
            // SAFETY: `tiles` exist only where `bf16_tiles()` said the tile unit computes as
            // its definition does, checked after the process was granted the tile data.
            return unsafe {
                tiles::matmul(t, x, m, || crate::model::kernels::rows16::tiles::Hardware)
            };
        }
        let isa = isa.min(cpu_level());
        assert_eq!(x.len(), m * self.k, "activation shape");
        let a = pack(x, m, self.k, isa);
        super::half_driver::matmul(self, &a, m, isa)
    }
}

impl PanelKernel for Bf16Matrix {
    type Weight = u16;
    type Act = u16;
    const CHUNK: usize = CHUNK;
    /// 16 KiB of a panel's rows: L1.
    const K_SLICE: usize = 1024;

    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn rows(&self, rows: std::ops::Range<usize>) -> &[u16] {
        &self.bits.get()[rows.start * self.k..rows.end * self.k]
    }

    fn accumulate(&self, job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
        accumulate(job, isa, acc)
    }

    fn tail_step(&self, w: u16, x: u16, sum: f32) -> f32 {
        widen(w).mul_add(widen(x), sum)
    }
}

/// One pass of weight rows over a slice of a panel (chunks of sixteen values).
pub(crate) type Job<'a> = super::half_driver::Job<'a, u16, u16>;

/// Adds the job's chunks into `acc[c][r·8 + l]` (weight row `c`, panel row `r`, lane `l`) at
/// level `isa`: every level performs the same operations in the same order.
fn accumulate(job: &Job<'_>, isa: Isa, acc: &mut [Lanes]) {
    job.check(acc, CHUNK);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `isa` was capped by what this CPU executes (see `cpu_level`); the lengths
        // were checked above.
        if isa >= Isa::Avx512Bf16 {
            unsafe { x86::avx512bf16::accumulate(job, acc) };
            return;
        }
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

/// The definition, one lane at a time: lane `l` takes the chunk's values `2l + 1`, then `2l`.
pub(crate) fn accumulate_portable(job: &Job<'_>, acc: &mut [Lanes]) {
    accumulate_lanes(job, CHUNK, acc, |w, x, lanes| {
        for (l, a) in lanes.iter_mut().enumerate() {
            *a = widen(w[2 * l + 1]).mul_add(widen(x[2 * l + 1]), *a);
            *a = widen(w[2 * l]).mul_add(widen(x[2 * l]), *a);
        }
    });
}

/// Whether `vdpbf16ps` outruns the AVX-512 FMA path on this CPU, timed once per process on a
/// small product (about a millisecond: each path five times, alternating, the best of each).
/// They compute the same bits; which is faster depends on the CPU: on one 2-core Xeon with
/// AVX-512 FP16 (no AMX) the FMA path evaluated a Llama-3.2-1B-shaped BF16 model 1.28× faster,
/// where earlier machines favoured `vdpbf16ps`. The FMA path is taken only when it is more
/// than 5% faster.
pub fn vdpbf16ps_pays() -> bool {
    use std::sync::OnceLock;
    static PAYS: OnceLock<bool> = OnceLock::new();
    *PAYS.get_or_init(|| {
        if cpu_level() < Isa::Avx512Bf16 || super::isa() < Isa::Avx512Bf16 {
            return false;
        }
        let (m, n, k) = (64, 128, 1024);
        let bits: Vec<u8> = (0..n * k)
            .flat_map(|i| {
                ::half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_le_bytes()
            })
            .collect();
        let Some(w) = Bf16Matrix::from_bytes(&bits, n, k) else {
            return true;
        };
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 32.0)
            .collect();
        let time = |isa: Isa| {
            let start = std::time::Instant::now();
            std::hint::black_box(w.matmul_at(&x, m, isa));
            start.elapsed()
        };
        let (mut dot, mut fma) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for _ in 0..5 {
            dot = dot.min(time(Isa::Avx512Bf16));
            fma = fma.min(time(Isa::Avx512));
        }
        let pays = dot.as_secs_f64() <= 1.05 * fma.as_secs_f64();
        tracing::debug!("BF16: vdpbf16ps {dot:?}, FMA {fma:?} per product; vdpbf16ps used: {pays}");
        pays
    })
}

super::own_matrix_from_inherent!(Bf16Matrix);

/// Activations as [`activation_bits`], packed in panels of [`PANEL`] rows.
pub type Panels = ChunkPanels<u16>;
/// One panel of them.
pub type PanelRef<'a> = ChunkPanel<'a, u16>;

/// Rounds, flushes and packs `x [m, k]`, with SIMD where `isa` allows (the same bits).
pub fn pack(x: &[f32], m: usize, k: usize, isa: Isa) -> Panels {
    Panels::pack(
        x,
        (m, k, CHUNK),
        |src, dst| round_chunk(src, dst, isa),
        activation_bits,
    )
}

/// Sixteen values as [`activation_bits`].
fn round_chunk(src: &[f32], dst: &mut [u16], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx2 {
            // SAFETY: AVX2 is present (`isa` is capped by detection); both slices hold
            // sixteen values (asserted inside).
            unsafe { x86::avx2::round16(src, dst, ACTIVATION_MIN_EXP) };
            return;
        }
    }
    let _ = isa;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = activation_bits(s);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "bf16_x86.rs"]
mod x86;

#[path = "bf16_tiles.rs"]
mod tiles;

#[cfg(test)]
#[path = "bf16_tests.rs"]
mod tests;
