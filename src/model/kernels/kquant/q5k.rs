//! GGUF Q5_K super-blocks: 256 values in eight 32-value sub-blocks, each with a 6-bit scale
//! and min; value `e` of sub-block `s` is `d·scale_s·q_e − dmin·min_s`, q 5-bit (a nibble plus
//! one high bit). Decoded here for the interleaved-rows repacking of
//! [`crate::model::kernels::rows16::q4k`] and the tests' references.

use half::f16;

use super::{unpack_scales_mins, SuperBlock};

/// One Q5_K super-block, scales and mins unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Q5KBlock {
    pub(crate) d: f16,
    pub(crate) dmin: f16,
    pub(crate) scales: [u8; 8],
    pub(crate) mins: [u8; 8],
    /// Byte `i`, bit `2g` (resp. `2g + 1`): bit 4 of value `64g + i` (resp. `64g + 32 + i`).
    qh: [u8; 32],
    /// Byte `32g + i`: bits 0–3 of value `64g + i` in the low nibble, of `64g + 32 + i` in the
    /// high one.
    qs: [u8; 128],
}

impl SuperBlock for Q5KBlock {
    /// f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 32 bytes of high bits, 128
    /// bytes of nibbles.
    const FILE_BYTES: usize = 176;

    fn decode(file: &[u8]) -> Self {
        let packed: &[u8; 12] = file[4..16].try_into().expect("12 bytes");
        let (scales, mins) = unpack_scales_mins(packed);
        Self {
            d: f16::from_le_bytes([file[0], file[1]]),
            dmin: f16::from_le_bytes([file[2], file[3]]),
            scales,
            mins,
            qh: file[16..48].try_into().expect("32 bytes"),
            qs: file[48..176].try_into().expect("128 bytes"),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        for (g, out) in out.chunks_exact_mut(64).enumerate() {
            let (lo, hi) = out.split_at_mut(32);
            let (d1, m1) = (
                d * self.scales[2 * g] as f32,
                dmin * self.mins[2 * g] as f32,
            );
            let (d2, m2) = (
                d * self.scales[2 * g + 1] as f32,
                dmin * self.mins[2 * g + 1] as f32,
            );
            let nibbles = &self.qs[32 * g..32 * g + 32];
            for (i, (l, h)) in lo.iter_mut().zip(hi).enumerate() {
                let (q_lo, q_hi) = self.values(g, i, nibbles[i]);
                *l = d1 * q_lo as f32 - m1;
                *h = d2 * q_hi as f32 - m2;
            }
        }
    }
}

impl Q5KBlock {
    /// Values `64g + i` and `64g + 32 + i`, whose low bits are in `nibbles`.
    #[inline(always)]
    fn values(&self, g: usize, i: usize, nibbles: u8) -> (u8, u8) {
        let high = self.qh[i] >> (2 * g);
        (
            (nibbles & 0x0F) | ((high & 1) << 4),
            (nibbles >> 4) | ((high & 2) << 3),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, random_with_mins, reference_scale_and_min};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: finite positive scales, random packed scales, mins and values.
    pub(crate) fn random_q5k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        random_with_mins(Q5KBlock::FILE_BYTES, (n, k), seed)
    }

    /// Value `e` of a super-block by the GGUF definition, in f64.
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let (scale, min) = reference_scale_and_min(blk, e / 32);
        let byte = blk[48 + 32 * (e / 64) + e % 32];
        let low = if (e / 32).is_multiple_of(2) {
            byte & 15
        } else {
            byte >> 4
        };
        let q = low | (((blk[16 + e % 32] >> (e / 32)) & 1) << 4);
        scale * q as f64 - min
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q5KBlock>(GgmlDType::Q5K, random_q5k);
    }
}
