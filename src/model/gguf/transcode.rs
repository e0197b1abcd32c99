//! Stored types that ppl reads by rewriting each block, exactly, as a type candle computes
//! with: IQ4_NL (ggml type 20) as Q8_0, IQ4_XS (type 23) as F32. Our kernels take both in
//! their stored form (the reader's `RawTensor` keeps it until a path needs candle's); the
//! rewrite serves candle's paths (`--kernels candle`, the GPU), `--precision f32`, the norms'
//! and embeddings' candle tensors.
//!
//! IQ4_NL: llama.cpp writes it where a K-quant mix (Q2_K,
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
//! instead of 18 for those tensors where candle holds them (our kernels keep 18).
//!
//! IQ4_XS ([`crate::model::kernels::kquant::iq4xs`]): 256-value super-blocks of eight
//! sub-blocks with 6-bit signed scales over the same table; its values `d·(ls − 32)·table[i]`
//! need twelve integer bits, so of candle's types only F32 holds them exactly (4 bytes a
//! value instead of 0.53: only candle's paths pay it).

use candle_core::quantized::GgmlDType;

use crate::model::kernels::kquant::iq4xs::Iq4XsBlock;
use crate::model::kernels::kquant::{SuperBlock, QK_K};

/// ggml's `kvalues_iq4nl`: the sixteen values an IQ4_NL index selects (before the scale).
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Values per IQ4_NL block.
const BLOCK: usize = 32;
/// ggml's type id of IQ4_NL.
pub const IQ4_NL_TYPE: u32 = 20;
/// ggml's type id of IQ4_XS.
pub const IQ4_XS_TYPE: u32 = 23;
/// Bytes per IQ4_NL block: f16 `d`, sixteen bytes of indices.
const IQ4_NL_BLOCK_BYTES: usize = 2 + BLOCK / 2;
/// Bytes per Q8_0 block: f16 `d`, thirty-two signed bytes.
const Q8_0_BLOCK_BYTES: usize = 2 + BLOCK;

/// A stored type read as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transcode {
    /// IQ4_NL blocks rewritten as Q8_0 blocks of the same values.
    Iq4NlAsQ8_0,
    /// IQ4_XS super-blocks rewritten as their F32 values.
    Iq4XsAsF32,
}

impl Transcode {
    /// The rewrite for ggml type `type_id`, if ppl reads that type by one.
    pub fn of(type_id: u32) -> Option<Self> {
        match type_id {
            IQ4_NL_TYPE => Some(Self::Iq4NlAsQ8_0),
            IQ4_XS_TYPE => Some(Self::Iq4XsAsF32),
            _ => None,
        }
    }

    /// The stored type's name, as GGUF tools spell it.
    pub fn stored_name(self) -> &'static str {
        match self {
            Self::Iq4NlAsQ8_0 => "IQ4_NL",
            Self::Iq4XsAsF32 => "IQ4_XS",
        }
    }

    /// ggml's id of the stored type.
    pub fn type_id(self) -> u32 {
        match self {
            Self::Iq4NlAsQ8_0 => IQ4_NL_TYPE,
            Self::Iq4XsAsF32 => IQ4_XS_TYPE,
        }
    }

    /// The type the tensor is computed as on candle's paths.
    pub fn computed_as(self) -> GgmlDType {
        match self {
            Self::Iq4NlAsQ8_0 => GgmlDType::Q8_0,
            Self::Iq4XsAsF32 => GgmlDType::F32,
        }
    }

    /// Values per stored block.
    pub fn block_size(self) -> usize {
        match self {
            Self::Iq4NlAsQ8_0 => BLOCK,
            Self::Iq4XsAsF32 => QK_K,
        }
    }

    /// Bytes per stored block.
    pub fn stored_block_bytes(self) -> usize {
        match self {
            Self::Iq4NlAsQ8_0 => IQ4_NL_BLOCK_BYTES,
            Self::Iq4XsAsF32 => Iq4XsBlock::FILE_BYTES,
        }
    }

    /// Bytes of `elems` values in the stored form (whole blocks).
    pub fn stored_bytes(self, elems: usize) -> usize {
        elems / self.block_size() * self.stored_block_bytes()
    }

    /// The stored bytes (whole blocks) rewritten as [`Transcode::computed_as`]'s blocks.
    pub fn apply(self, stored: &[u8]) -> Vec<u8> {
        match self {
            Self::Iq4NlAsQ8_0 => iq4_nl_as_q8_0(stored),
            Self::Iq4XsAsF32 => iq4_xs_as_f32(stored),
        }
    }

    /// The first stored block whose f16 scale `d` (the first two bytes of every block of
    /// both types) is not finite, described; `None` when all are. Checked on the stored
    /// bytes, so the rewrite never meets one.
    pub fn first_non_finite(self, stored: &[u8]) -> Option<String> {
        let block = self.stored_block_bytes();
        stored.chunks_exact(block).enumerate().find_map(|(b, blk)| {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]);
            (!d.is_finite()).then(|| {
                let what = if d.is_nan() { "NaN" } else { "infinite" };
                format!("block {b}'s scale is {what}")
            })
        })
    }
}

/// The type a tensor is written in: one candle has, or one the reader rewrites for it
/// ([`Transcode`]). The writers' view (`ppl synth`); the reader's is
/// [`super::TensorInfo`]'s `dtype` and `transcode`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StoredType {
    Candle(GgmlDType),
    Rewritten(Transcode),
}

impl StoredType {
    /// ggml's type id, as the file's tensor directory writes it.
    pub fn type_id(self) -> u32 {
        match self {
            Self::Candle(d) => super::tensor_info::ggml_type_id(d),
            Self::Rewritten(t) => t.type_id(),
        }
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::Candle(d) => d.block_size(),
            Self::Rewritten(t) => t.block_size(),
        }
    }

    /// Bytes of `elems` values (whole blocks).
    pub fn stored_bytes(self, elems: usize) -> u64 {
        (match self {
            Self::Candle(d) => elems / d.block_size() * d.type_size(),
            Self::Rewritten(t) => t.stored_bytes(elems),
        }) as u64
    }
}

impl From<GgmlDType> for StoredType {
    fn from(d: GgmlDType) -> Self {
        Self::Candle(d)
    }
}

impl PartialEq<GgmlDType> for StoredType {
    fn eq(&self, other: &GgmlDType) -> bool {
        *self == Self::Candle(*other)
    }
}

/// candle's names for its types (`Q4K`), GGUF's for the others (`IQ4_XS`).
impl std::fmt::Debug for StoredType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Candle(d) => write!(f, "{d:?}"),
            Self::Rewritten(t) => f.write_str(t.stored_name()),
        }
    }
}

/// Each IQ4_XS super-block as its 256 f32 values (ggml's dequantization, exact).
fn iq4_xs_as_f32(stored: &[u8]) -> Vec<u8> {
    let blocks = stored.chunks_exact(Iq4XsBlock::FILE_BYTES);
    let mut out = Vec::with_capacity(blocks.len() * QK_K * 4);
    let mut values = [0f32; QK_K];
    for block in blocks {
        Iq4XsBlock::decode(block).dequantize(&mut values);
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    out
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

    /// The F32 form of IQ4_XS super-blocks is ggml's definition, value by value, and a NaN
    /// scale is found in the stored bytes.
    #[test]
    fn iq4_xs_reads_as_its_f32_values() {
        use crate::model::kernels::kquant::iq4xs::tests::{random_iq4xs, reference};
        let mut seed = 17;
        let mut stored = random_iq4xs(1, 3 * QK_K, &mut seed);
        let t = Transcode::of(23).unwrap();
        assert_eq!((t.computed_as(), t.block_size()), (GgmlDType::F32, 256));
        assert_eq!(t.stored_bytes(3 * QK_K), stored.len());
        let f32s = t.apply(&stored);
        for (i, v) in f32s.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes(v.try_into().unwrap()) as f64;
            let blk = &stored[i / QK_K * 136..][..136];
            assert_eq!(v, reference(blk, i % QK_K), "value {i}");
        }
        assert_eq!(t.first_non_finite(&stored), None);
        stored[2 * 136..][..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
        assert_eq!(
            t.first_non_finite(&stored).as_deref(),
            Some("block 2's scale is NaN")
        );
    }

    #[test]
    fn only_iq4_nl_and_iq4_xs_are_rewritten() {
        assert_eq!(Transcode::of(20), Some(Transcode::Iq4NlAsQ8_0));
        assert_eq!(Transcode::of(23), Some(Transcode::Iq4XsAsF32));
        for id in [0, 2, 8, 12, 21, 22, 30, 39] {
            assert_eq!(Transcode::of(id), None, "type {id}");
        }
    }
}
