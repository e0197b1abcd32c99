//! Our own CPU kernels, only where a benchmark showed candle to be the bottleneck.
//!
//! Measured (2-core AVX2): candle's Q4_1 matmul has no SIMD path on x86 and ran SmolLM2 Q4_1
//! at 18 tokens/s against 213 tokens/s for its f32 GEMM; its Q5_0 product is scalar too
//! (Gemma 3 270M Q4_K_M, mostly Q5_0: 12.7 tokens/s natively, 154 in f32). [`q4_1`] (Q4_1 ×
//! Q8_1) and [`int8`] (Q5_0 and Q8_0 × Q8_0) are AVX2 micro-kernels with portable fallbacks
//! that give bit-identical results; [`panel`] quantizes the activations and drives them.

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
