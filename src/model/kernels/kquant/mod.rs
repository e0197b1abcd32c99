//! K-quant formats (GGUF Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and their activations, as llama.cpp's
//! CPU backend computes them: each activation row is quantized to Q8_K ([`q8k`]: 256-value
//! super-blocks, an f32 scale, 16 sums of 16 values), and each output is, per super-block, an
//! integer dot product of every 32- (Q4_K, Q5_K) or 16-value (Q2_K, Q3_K, Q6_K) sub-block
//! times its integer scale, the mins (Q2_K, Q4_K, Q5_K) or the values' offset (−4 for Q3_K,
//! −32 for Q6_K) through the activation sums, then one `d_w·d_a` float product per
//! super-block (and one `dmin_w·d_a` for the mins).
//!
//! This module holds the definitions — each format's super-block as the file lays it out, its
//! decoding and ggml's dequantization — and the Q8_K activations. The products are computed
//! by the interleaved-rows driver ([`super::rows16`]: [`super::rows16::q4k`] for Q4_K and
//! Q5_K, [`super::rows16::q6k`] for Q6_K, [`super::rows16::q3k`] for Q3_K,
//! [`super::rows16::q2k`] for Q2_K), which repacks the
//! weights at load from these decoded blocks and keeps this float order (the panel kernels
//! that computed them before, one weight row per lane group with a horizontal sum per output,
//! were removed once every level of the driver had been shown to give their bits).

pub mod iq4xs;
pub mod q2k;
pub mod q3k;
pub mod q4k;
pub mod q5k;
pub mod q6k;
pub mod q8k;
#[cfg(test)]
mod tests;

/// Values per super-block of every K-quant type and of Q8_K.
pub const QK_K: usize = 256;

/// One weight super-block of a K-quant format, decoded from the file.
pub trait SuperBlock: Sized + Send + Sync {
    /// Bytes of one super-block in a GGUF file.
    const FILE_BYTES: usize;

    /// From the super-block's bytes in the file (`FILE_BYTES` of them).
    fn decode(file: &[u8]) -> Self;

    /// The 256 values as f32: the same numbers, in the same float operations, as ggml's (and
    /// candle's) dequantization.
    fn dequantize(&self, out: &mut [f32]);
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
