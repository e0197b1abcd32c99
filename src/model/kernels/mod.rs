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
//! - [`attention`]: causal f32 attention computing only the visible keys, fused from scores to
//!   values (candle's ops materialised four `[heads, t, t]` tensors per layer).
//! - [`math`]: a vectorised exponential and SiLU gating (glibc's scalar `expf` was 5–7%).

pub mod attention;
pub mod int8;
pub mod math;
pub mod panel;
pub mod q4_1;

/// AVX2 and FMA, detected once.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_available() -> bool {
    use std::sync::OnceLock;
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
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
