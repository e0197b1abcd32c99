//! GGUF Q3_K super-blocks: 256 values in sixteen 16-value sub-blocks, each with a 6-bit
//! scale stored `+32`; value `e` is `(d·(scale_{e/16} − 32))·q_e` with `q = low − 4·(1 − high)`
//! (two low bits and a high bit: −4..=3). The file's layout and definition, for the
//! interleaved-rows repacking of [`crate::model::kernels::rows16::q3k`] and the tests'
//! references.

use half::f16;

use super::{SuperBlock, QK_K};

/// One Q3_K super-block, as in the file. Value `128n + 32j + l` (n < 2, j < 4, l < 32) has
/// its low two bits at bit `2j` of byte `32n + l` of `qs` and its high bit at bit `4n + j` of
/// byte `l` of `hmask`; sub-block `s = e / 16`'s scale is [`Q3KBlock::scales`]'s unpacking of
/// the twelve bytes.
#[derive(Clone, Copy)]
pub struct Q3KBlock {
    hmask: [u8; 32],
    qs: [u8; 64],
    /// The sixteen scales less 32 (−32..=31).
    pub scales: [i8; 16],
    pub d: f16,
}

/// The sixteen 6-bit scales (less 32) of ggml's packing: scale `s` has its low four bits in
/// byte `s` (s < 8, low nibble) or `s − 8` (high nibble), its top two bits at bit `2·⌊s/4⌋` of
/// byte `8 + s mod 4`.
pub(crate) fn unpack_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|s| {
        let low = if s < 8 {
            packed[s] & 0x0F
        } else {
            packed[s - 8] >> 4
        };
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | high << 4) as i8 - 32
    })
}

impl Q3KBlock {
    /// The unsigned value `q + 4` (0..8) of `e`.
    #[inline(always)]
    pub fn unsigned_value(&self, e: usize) -> u8 {
        let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (self.qs[32 * n + l] >> (2 * j)) & 3;
        let high = (self.hmask[l] >> (4 * n + j)) & 1;
        low | high << 2
    }

    /// The file's low-bit bytes (`qs`) and high-bit bytes (`hmask`).
    pub fn bits(&self) -> (&[u8; 64], &[u8; 32]) {
        (&self.qs, &self.hmask)
    }
}

impl SuperBlock for Q3KBlock {
    /// 32 bytes of high bits, 64 of low bit pairs, 12 of packed scales, f16 d.
    const FILE_BYTES: usize = 110;

    fn decode(file: &[u8]) -> Self {
        Self {
            hmask: file[0..32].try_into().expect("32 bytes"),
            qs: file[32..96].try_into().expect("64 bytes"),
            scales: unpack_scales(&file[96..108]),
            d: f16::from_le_bytes([file[108], file[109]]),
        }
    }

    /// ggml's `dequantize_row_q3_K`: `dl = d·(scale − 32)`, then `dl·q`.
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * self.scales[e / 16] as f32;
            *o = dl * (self.unsigned_value(e) as i8 - 4) as f32;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, random_byte, random_f16};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: random bits and scales (both extremes, −32 and 31, included), a
    /// finite d.
    pub(crate) fn random_q3k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / QK_K {
            for i in 0..108 {
                // Some scales at the extremes: all bits clear (−32) and set (31).
                let v = match (b % 3, i) {
                    (0, 96) | (0, 104) => 0x00,
                    (1, 97) | (1, 105) => 0xFF,
                    _ => random_byte(seed),
                };
                bytes.push(v);
            }
            bytes.extend_from_slice(&random_f16(seed, 0.01));
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64, written from ggml's
    /// `dequantize_row_q3_K` loop (not from [`Q3KBlock`]).
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([blk[108], blk[109]]).to_f64();
        // ggml's `kmask` unpacking of the twelve scale bytes, as 32-bit words.
        let word = |i: usize| u32::from_le_bytes(blk[96 + 4 * i..100 + 4 * i].try_into().unwrap());
        let (a0, a1, tmp) = (word(0), word(1), word(2));
        let (k1, k2) = (0x0303_0303u32, 0x0F0F_0F0Fu32);
        let aux = [
            (a0 & k2) | ((tmp & k1) << 4),
            (a1 & k2) | (((tmp >> 2) & k1) << 4),
            ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
            ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
        ];
        let s = e / 16;
        let scale = (aux[s / 4].to_le_bytes()[s % 4] as i32 - 32) as f64;
        // The loop: per half n of 128 values, four shifts j, two runs of 16 values.
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let (qs, hmask) = (&blk[32..96], &blk[0..32]);
        let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i32;
        let minus = if hmask[l] & (1 << (4 * n + j)) != 0 {
            0
        } else {
            4
        };
        d * scale * (low - minus) as f64
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q3KBlock>(GgmlDType::Q3K, random_q3k);
    }

    #[test]
    fn decoded_values_and_scales_follow_the_reference() {
        let mut seed = 5;
        let bytes = random_q3k(1, 3 * QK_K, &mut seed);
        for blk in bytes.chunks_exact(Q3KBlock::FILE_BYTES) {
            let decoded = Q3KBlock::decode(blk);
            let d = decoded.d.to_f64();
            for e in 0..QK_K {
                let q = decoded.unsigned_value(e) as f64 - 4.0;
                let ours = d * decoded.scales[e / 16] as f64 * q;
                assert_eq!(ours, reference(blk, e), "value {e}");
            }
        }
    }
}
