//! GGUF IQ4_XS super-blocks (ggml type 23): 256 values in eight 32-value sub-blocks, each
//! with a 6-bit scale `ls` (0..=63, used as `ls − 32`), one f16 `d`, and a 4-bit index per
//! value into IQ4_NL's table of sixteen signed bytes ([`IQ4_NL_VALUES`]); value `e` is
//! `d·(ls_s − 32)·table[index_e]` with `s = e / 32`. Within a sub-block the indices lie as
//! in an IQ4_NL block: byte `16s + i` holds value `32s + i` in its low nibble and `32s + 16 + i`
//! in its high one. llama.cpp writes it for its IQ4_XS files (and inside the IQ2/IQ3 mixes);
//! its dot product takes Q8_K activations and forms the exact integer
//! `Σ_s (ls_s − 32)·Σ table[index]·q_a` per super-block, as our kernels do
//! ([`crate::model::kernels::rows16::iq4xs`]).
//!
//! Unlike IQ4_NL, these values are not `f16·byte` (the product `(ls − 32)·table[index]` needs
//! twelve bits), so no type candle computes with holds them exactly but F32: the reader hands
//! IQ4_XS tensors to candle's paths as F32 ([`crate::model::gguf::transcode`]), and our kernel
//! takes the stored bytes.

use half::f16;

use super::{SuperBlock, QK_K};
pub use crate::model::gguf::transcode::IQ4_NL_VALUES;

/// Sub-blocks of 32 values per super-block.
pub const SUB_BLOCKS: usize = QK_K / 32;

/// One IQ4_XS super-block, decoded: `d`, the eight signed sub-block scales `ls − 32`, and the
/// file's 128 bytes of indices.
#[derive(Clone, Copy)]
pub struct Iq4XsBlock {
    pub d: f16,
    /// Sub-block `s`'s scale `ls_s − 32` (−32..=31).
    pub scales: [i8; SUB_BLOCKS],
    qs: [u8; QK_K / 2],
}

impl Iq4XsBlock {
    /// The index (0..16) of value `e`.
    #[inline(always)]
    pub fn index(&self, e: usize) -> usize {
        let (s, i) = (e / 32, e % 32);
        let byte = self.qs[16 * s + i % 16];
        (if i < 16 { byte & 0x0F } else { byte >> 4 }) as usize
    }

    /// The signed byte `table[index]` of value `e` (before the scales).
    #[inline(always)]
    pub fn value(&self, e: usize) -> i8 {
        IQ4_NL_VALUES[self.index(e)]
    }

    /// The file's index bytes.
    pub fn index_bytes(&self) -> &[u8; QK_K / 2] {
        &self.qs
    }
}

impl SuperBlock for Iq4XsBlock {
    /// f16 `d`, u16 `scales_h` (the scales' top two bits, two per sub-block), four bytes
    /// `scales_l` (their low four bits, a nibble per sub-block), 128 bytes of indices.
    const FILE_BYTES: usize = 136;

    fn decode(file: &[u8]) -> Self {
        let high = u16::from_le_bytes([file[2], file[3]]);
        Self {
            d: f16::from_le_bytes([file[0], file[1]]),
            scales: std::array::from_fn(|s| {
                let low = (file[4 + s / 2] >> (4 * (s % 2))) & 0x0F;
                let top = ((high >> (2 * s)) & 3) as u8;
                (low | top << 4) as i8 - 32
            }),
            qs: file[8..136].try_into().expect("128 bytes"),
        }
    }

    /// ggml's `dequantize_row_iq4_xs`: `dl = d·(ls − 32)`, then `dl·table[index]` (both
    /// products exact in f32: eleven bits of `d` times twelve of the integers).
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let dl = d * self.scales[e / 32] as f32;
            *o = dl * self.value(e) as f32;
        }
    }
}

/// IQ4_XS super-blocks of `values` (a multiple of 256 of them), appended to `out`: each
/// sub-block's scale from its largest magnitude (that value maps to the table's −127), the
/// super-block's `d` from the largest scale (which becomes `ls − 32 = −32`), each value the
/// nearest table entry. The scheme of ggml's `quantize_row_iq4_nl_impl` without its search
/// over shifted scales or an importance matrix — for models whose values do not matter
/// (`ppl synth`'s random weights, the tests' files); ppl does not offer it as a quantizer.
pub fn quantize(values: &[f32], out: &mut Vec<u8>) {
    for block in values.chunks_exact(QK_K) {
        let sub_scales: [f32; SUB_BLOCKS] =
            std::array::from_fn(|s| -signed_max(&block[32 * s..][..32]) / 127.0);
        let d = f16::from_f32(-signed_max(&sub_scales) / 32.0);
        let (d32, mut scales_h, mut scales_l) = (d.to_f32(), 0u16, [0u8; 4]);
        let mut qs = [0u8; QK_K / 2];
        for (s, &scale) in sub_scales.iter().enumerate() {
            let l = if d32 == 0.0 {
                0
            } else {
                ((scale / d32).round() as i32).clamp(-32, 31)
            };
            let ls = (l + 32) as u16;
            scales_l[s / 2] |= ((ls & 0x0F) as u8) << (4 * (s % 2));
            scales_h |= (ls >> 4) << (2 * s);
            let indices = nearest_indices(&block[32 * s..][..32], d32 * l as f32);
            qs[16 * s..][..16].copy_from_slice(&indices);
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&scales_h.to_le_bytes());
        out.extend_from_slice(&scales_l);
        out.extend_from_slice(&qs);
    }
}

/// IQ4_NL blocks of `values` (a multiple of 32 of them), appended to `out`: `d` from the
/// largest magnitude (it maps to −127), each value the nearest table entry — the same plain
/// scheme as [`quantize`], for the rows an IQ4_XS model keeps in IQ4_NL.
pub fn quantize_iq4_nl(values: &[f32], out: &mut Vec<u8>) {
    for block in values.chunks_exact(32) {
        let d = f16::from_f32(-signed_max(block) / 127.0);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&nearest_indices(block, d.to_f32()));
    }
}

/// The value of the largest magnitude (the first of equals), with its sign.
fn signed_max(v: &[f32]) -> f32 {
    v.iter()
        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m })
}

/// The sixteen bytes of a 32-value block's indices (value `i` in the low nibble of byte `i`,
/// value `16 + i` in its high one), each the table entry nearest `value / scale` (index 8,
/// the table's 1, for a zero scale).
fn nearest_indices(block: &[f32], scale: f32) -> [u8; 16] {
    let nearest = |x: f32| -> u8 {
        if scale == 0.0 {
            return 8;
        }
        let x = x / scale;
        (0..16u8)
            .min_by(|&a, &b| {
                let da = (IQ4_NL_VALUES[a as usize] as f32 - x).abs();
                let db = (IQ4_NL_VALUES[b as usize] as f32 - x).abs();
                da.total_cmp(&db)
            })
            .unwrap_or(8)
    };
    std::array::from_fn(|i| nearest(block[i]) | nearest(block[16 + i]) << 4)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{random_byte, random_f16};
    use super::*;
    use crate::model::kernels::panel::tests::lcg;

    /// Random super-blocks: random scales (both extremes, 0 and 63, in some) and indices,
    /// finite `d` of both signs.
    pub(crate) fn random_iq4xs(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / QK_K {
            let mut d = random_f16(seed, 0.001);
            if b % 2 == 1 {
                d[1] |= 0x80;
            }
            bytes.extend_from_slice(&d);
            for i in 2..Iq4XsBlock::FILE_BYTES {
                bytes.push(match (b % 3, i) {
                    (0, 2..=7) => 0x00,
                    (1, 2..=7) => 0xFF,
                    _ => random_byte(seed),
                });
            }
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64, written from ggml's
    /// `dequantize_row_iq4_xs` loop (not from [`Iq4XsBlock`]).
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
        let scales_h = u16::from_le_bytes([blk[2], blk[3]]) as i32;
        let (ib, j) = (e / 32, e % 32);
        let ls = ((blk[4 + ib / 2] as i32 >> (4 * (ib % 2))) & 0xF)
            | (((scales_h >> (2 * ib)) & 3) << 4);
        let q = blk[8 + 16 * ib + j % 16];
        let index = if j < 16 { q & 0xF } else { q >> 4 };
        d * (ls - 32) as f64 * IQ4_NL_VALUES[index as usize] as f64
    }

    #[test]
    fn decoded_values_follow_the_reference() {
        let mut seed = 5;
        let bytes = random_iq4xs(1, 3 * QK_K, &mut seed);
        for blk in bytes.chunks_exact(Iq4XsBlock::FILE_BYTES) {
            let decoded = Iq4XsBlock::decode(blk);
            let mut out = [0f32; QK_K];
            decoded.dequantize(&mut out);
            for (e, &o) in out.iter().enumerate() {
                assert_eq!(o as f64, reference(blk, e), "value {e}");
            }
        }
    }

    #[test]
    fn quantized_values_are_close_to_the_originals() {
        let mut seed = 3;
        let x: Vec<f32> = (0..2 * QK_K).map(|_| lcg(&mut seed) * 0.05).collect();
        let mut bytes = Vec::new();
        quantize(&x, &mut bytes);
        assert_eq!(bytes.len(), 2 * Iq4XsBlock::FILE_BYTES);
        let (mut err, mut size) = (0f64, 0f64);
        for (b, blk) in bytes.chunks_exact(Iq4XsBlock::FILE_BYTES).enumerate() {
            for e in 0..QK_K {
                let want = x[b * QK_K + e] as f64;
                err += (reference(blk, e) - want).powi(2);
                size += want * want;
            }
        }
        // A 4-bit code: a relative RMS error of a few percent, not more.
        assert!(
            (err / size).sqrt() < 0.1,
            "relative RMS error {}",
            (err / size).sqrt()
        );
        // All zeros: d = 0, every value 0 (no division by zero).
        let mut zeros = Vec::new();
        quantize(&[0.0; QK_K], &mut zeros);
        assert!((0..QK_K).all(|e| reference(&zeros, e) == 0.0));
    }
}
