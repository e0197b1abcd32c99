//! Our own CPU kernels, only where a profile showed candle (or our previous kernel) to be the
//! bottleneck. Each has an AVX2 path chosen at run time and a portable one that performs the
//! same IEEE operations in the same order, so results are bit-identical with and without AVX2,
//! for any thread count, batch size or grouping of rows.
//!
//! - [`q4_1`] (Q4_1 × Q8_1) and [`int8`] (Q5_0 and Q8_0 × Q8_0): llama.cpp's CPU arithmetic
//!   for quantized weights, as micro-kernels over panels of 8 activation rows ([`panel`]
//!   quantizes the activations and drives them, blocked for L2). candle's Q4_1 and Q5_0
//!   products are scalar on x86 (SmolLM2 Q4_1: 18 tokens/s; Gemma 3 Q4_K_M, mostly Q5_0:
//!   12.7), its Q8_0 one per row; a per-row kernel of ours reached 93 tokens/s, the panels 240.
//! - [`kquant`] (Q4_K, Q5_K and Q6_K × Q8_K): the K-quant types of Q4_K_M / Q5_K_M / Q6_K
//!   files, on the same panels and driver; candle computed them one row at a time.
//! - [`attention`]: causal f32 attention computing only the visible keys, fused from scores to
//!   values (candle's ops materialised four `[heads, t, t]` tensors per layer).
//! - [`math`]: a vectorised exponential and SiLU gating (glibc's scalar `expf` was 5–7%).

pub mod attention;
pub mod int8;
pub mod kquant;
pub mod math;
pub mod panel;
pub mod q4_1;

use std::sync::Arc;

use candle_core::quantized::GgmlDType;

/// A weight matrix `[n, k]` (n outputs, k inputs) held for one of our kernels.
pub trait OwnMatrix: Send + Sync {
    /// `(n, k)`.
    fn shape(&self) -> (usize, usize);
    /// Bytes held.
    fn storage_bytes(&self) -> usize;
    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32>;
    /// Row `j` as f32: the same numbers as ggml's (and candle's) dequantization, so a tied
    /// embedding table is looked up from the output layer's copy, one row at a time.
    fn dequantize_row(&self, j: usize, out: &mut [f32]);
}

/// The one place that picks our kernel for a stored matrix `[n, k]` of GGUF type `dtype`:
/// `None` when candle's serves that type, `Some(Err(detail))` when the bytes do not have the
/// type's layout.
pub fn own_matrix(
    dtype: GgmlDType,
    bytes: &[u8],
    n: usize,
    k: usize,
) -> Option<Result<Arc<dyn OwnMatrix>, String>> {
    fn boxed<M: OwnMatrix + 'static>(m: Option<M>) -> Option<Arc<dyn OwnMatrix>> {
        m.map(|m| Arc::new(m) as Arc<dyn OwnMatrix>)
    }
    let m = match dtype {
        // ggml writes K-quants only for rows that are a multiple of 256; other shapes stay with
        // candle, whose verdict on them stands.
        GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K
            if k == 0 || !k.is_multiple_of(kquant::QK_K) =>
        {
            return None
        }
        GgmlDType::Q4K => boxed(kquant::q4k::Q4KMatrix::from_bytes(bytes, n, k)),
        GgmlDType::Q5K => boxed(kquant::q5k::Q5KMatrix::from_bytes(bytes, n, k)),
        GgmlDType::Q6K => boxed(kquant::q6k::Q6KMatrix::from_bytes(bytes, n, k)),
        GgmlDType::Q4_1 => boxed(q4_1::Q4_1Matrix::from_bytes(bytes, n, k)),
        GgmlDType::Q5_0 => boxed(int8::Int8Matrix::from_q5_0(bytes, n, k)),
        GgmlDType::Q8_0 => boxed(int8::Int8Matrix::from_q8_0(bytes, n, k)),
        _ => return None,
    };
    Some(m.ok_or_else(|| format!("a malformed {dtype:?} layout for [{n}, {k}]")))
}

/// The instruction sets our kernels can use, in increasing order. Every kernel gives the same
/// bits at every level (an MPI job may mix machines and must still give one answer); the level
/// only changes the speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: the definition every SIMD path is tested against.
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI (on top of AVX2).
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "none" | "scalar" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx512vnni" | "avx512_vnni" => Some(Isa::Avx512),
            _ => None,
        }
    }
}

/// What this CPU advertises (CPUID), before any cap.
#[cfg(target_arch = "x86_64")]
fn advertised() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    match (avx2, avx512) {
        (_, true) => Isa::Avx512,
        (true, false) => Isa::Avx2,
        _ => Isa::Portable,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn advertised() -> Isa {
    Isa::Portable
}

/// The level our kernels run at: what the CPU advertises, capped by `PPL_ISA`
/// (`portable`, `avx2`, `avx512`), detected once per process.
pub fn isa() -> Isa {
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let found = advertised();
        match std::env::var("PPL_ISA")
            .ok()
            .as_deref()
            .and_then(Isa::parse)
        {
            Some(cap) => found.min(cap),
            None => found,
        }
    })
}

/// AVX2 and FMA may be used (see [`isa`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_available() -> bool {
    isa() >= Isa::Avx2
}

/// Sum of the eight lanes as ggml's `hsum_float_8` orders it:
/// `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum256(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}
