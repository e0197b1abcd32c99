//! GGUF Q2_K super-blocks: 256 values in sixteen 16-value sub-blocks, each with a 4-bit scale
//! and a 4-bit min (one byte: scale low, min high), and two f16 factors `d` and `dmin`; value
//! `e` is `(d·scale_s)·q_e − dmin·min_s` with `q` two bits (0..=3) and `s = e / 16`. The
//! file's layout and definition, for the interleaved-rows repacking of
//! [`crate::model::kernels::rows16::q2k`] and the tests' references.

use half::f16;

use super::{SuperBlock, QK_K};

/// One Q2_K super-block, as in the file: sixteen scale/min bytes, 64 bytes of two-bit values
/// (value `128n + 32j + l`, n < 2, j < 4, l < 32, at bit `2j` of byte `32n + l`: Q3_K's low
/// bits), f16 `d`, f16 `dmin`.
#[derive(Clone, Copy)]
pub struct Q2KBlock {
    qs: [u8; 64],
    /// Sub-block `s`'s scale (0..=15).
    pub scales: [u8; 16],
    /// Sub-block `s`'s min (0..=15).
    pub mins: [u8; 16],
    pub d: f16,
    pub dmin: f16,
}

impl Q2KBlock {
    /// The two-bit value `q` (0..=3) of `e`.
    #[inline(always)]
    pub fn value(&self, e: usize) -> u8 {
        let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
        (self.qs[32 * n + l] >> (2 * j)) & 3
    }

    /// The file's two-bit bytes.
    pub fn bits(&self) -> &[u8; 64] {
        &self.qs
    }
}

impl SuperBlock for Q2KBlock {
    /// 16 bytes of scales and mins, 64 of bit pairs, f16 d, f16 dmin.
    const FILE_BYTES: usize = 84;

    fn decode(file: &[u8]) -> Self {
        Self {
            scales: std::array::from_fn(|s| file[s] & 0x0F),
            mins: std::array::from_fn(|s| file[s] >> 4),
            qs: file[16..80].try_into().expect("64 bytes"),
            d: f16::from_le_bytes([file[80], file[81]]),
            dmin: f16::from_le_bytes([file[82], file[83]]),
        }
    }

    /// ggml's `dequantize_row_q2_K`: `dl = d·scale`, `ml = dmin·min`, then `dl·q − ml`.
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * self.scales[e / 16] as f32;
            let ml = dmin * self.mins[e / 16] as f32;
            *o = dl * self.value(e) as f32 - ml;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, random_byte, random_f16};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: random bits, scales and mins (both extremes, 0 and 15, included),
    /// finite d and dmin.
    pub(crate) fn random_q2k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / QK_K {
            for i in 0..80 {
                let v = match (b % 3, i) {
                    (0, 0..=3) => 0x00,
                    (1, 0..=3) => 0xFF,
                    (2, 0) => 0x0F,
                    (2, 1) => 0xF0,
                    _ => random_byte(seed),
                };
                bytes.push(v);
            }
            bytes.extend_from_slice(&random_f16(seed, 0.01));
            bytes.extend_from_slice(&random_f16(seed, 0.004));
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64, written from ggml's
    /// `dequantize_row_q2_K` loop (not from [`Q2KBlock`]).
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([blk[80], blk[81]]).to_f64();
        let dmin = f16::from_le_bytes([blk[82], blk[83]]).to_f64();
        // The loop: per half n of 128 values, four shifts j, two runs of 16 values, each run
        // the next scale byte.
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let sc = blk[8 * n + 2 * j + l / 16];
        let q = ((blk[16 + 32 * n + l] >> (2 * j)) & 3) as f64;
        d * (sc & 0x0F) as f64 * q - dmin * (sc >> 4) as f64
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q2KBlock>(GgmlDType::Q2K, random_q2k);
    }

    #[test]
    fn decoded_values_scales_and_mins_follow_the_reference() {
        let mut seed = 9;
        let bytes = random_q2k(1, 3 * QK_K, &mut seed);
        for blk in bytes.chunks_exact(Q2KBlock::FILE_BYTES) {
            let decoded = Q2KBlock::decode(blk);
            let (d, dmin) = (decoded.d.to_f64(), decoded.dmin.to_f64());
            for e in 0..QK_K {
                let s = e / 16;
                let ours = d * decoded.scales[s] as f64 * decoded.value(e) as f64
                    - dmin * decoded.mins[s] as f64;
                assert_eq!(ours, reference(blk, e), "value {e}");
            }
        }
    }
}
