//! GGUF Q6_K super-blocks: 256 values in sixteen 16-value sub-blocks, each with a signed 8-bit
//! scale; value `e` is `d·scale_{e/16}·(q_e − 32)`, q 6-bit (a nibble plus two high bits). The
//! file's layout and definition, for the interleaved-rows repacking of
//! [`crate::model::kernels::rows16::q6k`] and the tests' references.

use half::f16;

use super::{SuperBlock, QK_K};

/// One Q6_K super-block, as in the file. Value `128h + 32i + l` (h < 2, i < 4, l < 32) has
/// its low four bits in byte `64h + 32(i mod 2) + l` of `ql` (low nibble for i < 2, high
/// otherwise) and its top two bits at bit `2i` of byte `32h + l` of `qh`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Q6KBlock {
    ql: [u8; 128],
    qh: [u8; 64],
    scales: [i8; 16],
    d: f16,
}

impl Q6KBlock {
    /// The unsigned 6-bit value (0..64) of `e`.
    #[inline(always)]
    fn value(&self, e: usize) -> u8 {
        let (h, i, l) = (e / 128, (e / 32) % 4, e % 32);
        let byte = self.ql[64 * h + 32 * (i % 2) + l];
        let low = if i < 2 { byte & 0x0F } else { byte >> 4 };
        low | (((self.qh[32 * h + l] >> (2 * i)) & 3) << 4)
    }
}

impl SuperBlock for Q6KBlock {
    /// 128 bytes of nibbles, 64 of high bit pairs, 16 signed scales, f16 d.
    const FILE_BYTES: usize = 210;

    fn decode(file: &[u8]) -> Self {
        Self {
            ql: file[0..128].try_into().expect("128 bytes"),
            qh: file[128..192].try_into().expect("64 bytes"),
            scales: std::array::from_fn(|s| file[192 + s] as i8),
            d: f16::from_le_bytes([file[208], file[209]]),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let q = self.value(e) as i8 - 32;
            *o = d * self.scales[e / 16] as f32 * q as f32;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, random_byte, random_f16};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: random values and signed scales (−128 included), a finite d.
    pub(crate) fn random_q6k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / QK_K {
            for i in 0..208 {
                // Some scales at the extremes, −128 and 127.
                let v = match (b % 3, i) {
                    (0, 192) => 0x80,
                    (0, 193) => 0x7F,
                    _ => random_byte(seed),
                };
                bytes.push(v);
            }
            bytes.extend_from_slice(&random_f16(seed, 0.001));
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64.
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([blk[208], blk[209]]).to_f64();
        let scale = blk[192 + e / 16] as i8 as f64;
        let (h, l) = (e / 128, e % 32);
        let (ql, qh) = (&blk[64 * h..], blk[128 + 32 * h + l]);
        let q = match (e / 32) % 4 {
            0 => (ql[l] & 15) | ((qh & 3) << 4),
            1 => (ql[l + 32] & 15) | (((qh >> 2) & 3) << 4),
            2 => (ql[l] >> 4) | (((qh >> 4) & 3) << 4),
            _ => (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4),
        };
        d * scale * (q as f64 - 32.0)
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q6KBlock>(GgmlDType::Q6K, random_q6k);
    }
}
