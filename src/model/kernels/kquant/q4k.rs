//! GGUF Q4_K super-blocks: 256 values in eight 32-value sub-blocks, each with a 6-bit scale
//! and min; value `e` of sub-block `s` is `d·scale_s·q_e − dmin·min_s`, q 4-bit. Decoded here
//! (the twelve bytes of packed scales and mins unpacked) for the interleaved-rows repacking of
//! [`crate::model::kernels::rows16::q4k`] and the tests' references.

use half::f16;

use super::{unpack_scales_mins, SuperBlock};

/// One Q4_K super-block, scales and mins unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Q4KBlock {
    pub(crate) d: f16,
    pub(crate) dmin: f16,
    pub(crate) scales: [u8; 8],
    pub(crate) mins: [u8; 8],
    /// Byte `32g + i`: value `64g + i` in the low nibble, `64g + 32 + i` in the high one.
    pub(crate) qs: [u8; 128],
}

impl SuperBlock for Q4KBlock {
    /// f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes of nibbles.
    const FILE_BYTES: usize = 144;

    fn decode(file: &[u8]) -> Self {
        let packed: &[u8; 12] = file[4..16].try_into().expect("12 bytes");
        let (scales, mins) = unpack_scales_mins(packed);
        Self {
            d: f16::from_le_bytes([file[0], file[1]]),
            dmin: f16::from_le_bytes([file[2], file[3]]),
            scales,
            mins,
            qs: file[16..144].try_into().expect("128 bytes"),
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
            for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&self.qs[32 * g..32 * g + 32]) {
                *l = d1 * (q & 0x0F) as f32 - m1;
                *h = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, random_with_mins, reference_scale_and_min};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: finite positive scales, random packed scales, mins and values.
    pub(crate) fn random_q4k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        random_with_mins(Q4KBlock::FILE_BYTES, (n, k), seed)
    }

    /// Value `e` of a super-block by the GGUF definition, in f64.
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let (scale, min) = reference_scale_and_min(blk, e / 32);
        let byte = blk[16 + 32 * (e / 64) + e % 32];
        let q = if (e / 32).is_multiple_of(2) {
            byte & 15
        } else {
            byte >> 4
        };
        scale * q as f64 - min
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q4KBlock>(GgmlDType::Q4K, random_q4k);
    }
}
