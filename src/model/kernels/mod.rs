//! Our own CPU kernels, only where a benchmark showed candle to be the bottleneck.
//!
//! Measured on the reference workload (2-core AVX2, SmolLM2 Q4_1, 4 chunks): candle's Q4_1
//! matmul has no SIMD path on x86 and ran the model at 18 tokens/s against 213 tokens/s for
//! its f32 GEMM. [`q4_1`] is an AVX2 Q4_1 × Q8_1 matmul with a portable fallback that gives
//! bit-identical results.

pub mod q4_1;
