//! Stored types that ppl reads by rewriting each block, exactly, as a type it computes with.
//!
//! IQ4_NL (ggml type 20) is the one today. llama.cpp writes it where a K-quant mix (Q2_K,
//! Q3_K_S/M/L, the IQ mixes) meets rows that are not a multiple of 256 values — every
//! projection of SmolLM2 (576), Qwen2.5-0.5B (896) or Gemma 3 270M (640) — so without it
//! those models' common files could not be read at all. Its 32-value block is an f16 scale
//! `d` and sixteen bytes of 4-bit indices into a fixed table of sixteen signed bytes
//! ([`IQ4_NL_VALUES`]); value `e` is `d·table[index_e]`, indices `0..16` in the low nibbles,
//! `16..32` in the high ones (Q4_0's order).
//!
//! Why a rewrite and not a kernel of its own: every such value is `d·q` with `q` a signed
//! byte, which is exactly a Q8_0 block (the same `d`, `q = table[index]`). So an IQ4_NL
//! tensor is read as the Q8_0 tensor of the same values, and everything downstream — our
//! Q8_0 kernels at every instruction-set level, candle's paths, `--precision f32`, sharding,
//! the memory planner — sees a Q8_0 tensor. The result is llama.cpp's IQ4_NL arithmetic:
//! its dot product forms the same exact integer block sums `Σ table[index]·q_a` and scales
//! each block once by `d_w·d_a`, as Q8_0's does. The price is memory: 34 bytes per block
//! instead of 18 for those tensors (stated by `ppl validate`'s planner, which counts Q8_0).

use candle_core::quantized::GgmlDType;

/// ggml's `kvalues_iq4nl`: the sixteen values an IQ4_NL index selects (before the scale).
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Values per IQ4_NL block.
const BLOCK: usize = 32;
/// Bytes per IQ4_NL block: f16 `d`, sixteen bytes of indices.
const IQ4_NL_BLOCK_BYTES: usize = 2 + BLOCK / 2;
/// Bytes per Q8_0 block: f16 `d`, thirty-two signed bytes.
const Q8_0_BLOCK_BYTES: usize = 2 + BLOCK;

/// A stored type read as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transcode {
    /// IQ4_NL blocks rewritten as Q8_0 blocks of the same values.
    Iq4NlAsQ8_0,
}

impl Transcode {
    /// The rewrite for ggml type `type_id`, if ppl reads that type by one.
    pub fn of(type_id: u32) -> Option<Self> {
        (type_id == 20).then_some(Self::Iq4NlAsQ8_0)
    }

    /// The type the tensor is computed as.
    pub fn computed_as(self) -> GgmlDType {
        match self {
            Self::Iq4NlAsQ8_0 => GgmlDType::Q8_0,
        }
    }

    /// Values per stored block.
    pub fn block_size(self) -> usize {
        BLOCK
    }

    /// Bytes per stored block.
    pub fn stored_block_bytes(self) -> usize {
        match self {
            Self::Iq4NlAsQ8_0 => IQ4_NL_BLOCK_BYTES,
        }
    }

    /// The stored bytes (whole blocks) rewritten as [`Transcode::computed_as`]'s blocks.
    pub fn apply(self, stored: &[u8]) -> Vec<u8> {
        match self {
            Self::Iq4NlAsQ8_0 => iq4_nl_as_q8_0(stored),
        }
    }
}

/// Each IQ4_NL block as the Q8_0 block of the same values: `d` copied, `q_e = table[index_e]`.
fn iq4_nl_as_q8_0(stored: &[u8]) -> Vec<u8> {
    let blocks = stored.chunks_exact(IQ4_NL_BLOCK_BYTES);
    let mut out = Vec::with_capacity(blocks.len() * Q8_0_BLOCK_BYTES);
    for block in blocks {
        let (d, indices) = block.split_at(2);
        out.extend_from_slice(d);
        let value = |index: u8| IQ4_NL_VALUES[index as usize] as u8;
        out.extend(indices.iter().map(|&i| value(i & 0x0F)));
        out.extend(indices.iter().map(|&i| value(i >> 4)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::Device;

    /// An IQ4_NL block from its scale and its 32 indices, as ggml packs it.
    fn iq4_nl_block(d: f32, indices: &[u8; 32]) -> Vec<u8> {
        let mut b = half::f16::from_f32(d).to_le_bytes().to_vec();
        b.extend((0..16).map(|j| indices[j] | (indices[16 + j] << 4)));
        b
    }

    /// The rewritten bytes, dequantized by candle as Q8_0, are ggml's IQ4_NL values
    /// `d·table[index]`, computed here from the definition, for every index in both halves.
    #[test]
    fn iq4_nl_reads_as_the_q8_0_block_of_the_same_values() {
        let scales = [0.0123f32, -0.5, 3.25e-4];
        let mut stored = Vec::new();
        let mut expected = Vec::new();
        for (b, &d) in scales.iter().enumerate() {
            let indices: [u8; 32] = std::array::from_fn(|e| ((e * 7 + b * 5) % 16) as u8);
            stored.extend(iq4_nl_block(d, &indices));
            let d = half::f16::from_f32(d).to_f32();
            expected.extend(
                indices
                    .iter()
                    .map(|&i| d * IQ4_NL_VALUES[i as usize] as f32),
            );
        }
        let t = Transcode::of(20).unwrap();
        assert_eq!(t.computed_as(), GgmlDType::Q8_0);
        assert_eq!(stored.len(), scales.len() * t.stored_block_bytes());
        let q8 = t.apply(&stored);
        assert_eq!(q8.len(), scales.len() * 34);
        let storage = candle_core::quantized::QStorage::from_data(
            std::borrow::Cow::Owned(q8),
            &Device::Cpu,
            GgmlDType::Q8_0,
        )
        .unwrap();
        let q = QTensor::new(storage, (scales.len() * 32,)).unwrap();
        let got: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().to_vec1().unwrap();
        assert_eq!(got, expected);
    }

    #[test]
    fn only_iq4_nl_is_rewritten() {
        assert_eq!(Transcode::of(20), Some(Transcode::Iq4NlAsQ8_0));
        for id in [0, 2, 8, 12, 23, 30, 39] {
            assert_eq!(Transcode::of(id), None, "type {id}");
        }
    }
}
