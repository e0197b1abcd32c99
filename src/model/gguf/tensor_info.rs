//! The tensor directory of a GGUF file: the ggml types ppl computes with, each tensor's
//! [`TensorInfo`], and [`GgufFile`]'s access to a tensor's bytes in the map.

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use super::transcode::Transcode;
use super::{GgufError, GgufFile, Result};

/// The ggml tensor types, with the names llama.cpp prints.
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown type {id}"),
    };
    name.to_string()
}

/// ggml's type id of a candle type (the inverse of [`ggml_dtype`]).
pub fn ggml_type_id(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

/// The candle dtype for a ggml type id, when candle can compute with it.
pub fn ggml_dtype(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions outermost first (the reverse of GGUF's `ne` order), as candle expects.
    pub shape: Vec<usize>,
    /// The stored type, as the file names it.
    pub type_id: u32,
    /// The type ppl computes with (the stored one, or what [`TensorInfo::transcode`] makes).
    pub dtype: GgmlDType,
    /// Absolute byte offset of the data in its file.
    pub offset: u64,
    pub size: u64,
    /// Which mapped file holds the data (0 for a GGUF file; a safetensors shard of a
    /// Hugging Face checkpoint otherwise).
    pub file: usize,
    /// Rows to reorder on read: Hugging Face's rotary layout (each head's two halves) into
    /// GGUF's (adjacent pairs), as llama.cpp's converter does for Llama-style Q and K.
    pub permute: Option<RopePermute>,
    /// Set where the stored type is read as another ([`Transcode`]): then [`TensorInfo::dtype`]
    /// is the type computed with, and [`TensorInfo::size`] still counts the stored bytes.
    pub transcode: Option<Transcode>,
}

impl TensorInfo {
    /// Values per stored block (a [`Transcode`]d type's own, IQ4_XS's 256).
    pub fn block_size(&self) -> usize {
        self.transcode
            .map_or(self.dtype.block_size(), Transcode::block_size)
    }

    /// The stored type's name, as GGUF tools spell it.
    pub fn type_name(&self) -> String {
        ggml_type_name(self.type_id)
    }
}

/// The row permutation llama.cpp's converter applies to Llama-style Q/K projections: within
/// each head of `head_dim` rows, row `half * head_dim / 2 + i` moves to `2 * i + half`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopePermute {
    pub head_dim: usize,
}

impl RopePermute {
    /// Reorders the rows of `bytes` (`row_bytes` each).
    pub fn apply(&self, bytes: &[u8], row_bytes: usize) -> Vec<u8> {
        let hd = self.head_dim;
        let rows = bytes.len() / row_bytes;
        let mut out = vec![0u8; bytes.len()];
        for r in 0..rows {
            let (head, within) = (r / hd, r % hd);
            let (half, i) = (within / (hd / 2), within % (hd / 2));
            let dst = head * hd + 2 * i + half;
            out[dst * row_bytes..(dst + 1) * row_bytes]
                .copy_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        }
        out
    }
}

impl GgufFile {
    pub fn tensor_info(&self, name: &str, purpose: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
                purpose: purpose.to_string(),
            })
    }

    /// The bytes of a tensor in the type ppl computes with ([`TensorInfo::dtype`]), after
    /// checking its shape (borrowed from the map, rewritten from a [`Transcode`]d type, or
    /// reordered for a checkpoint whose Q/K rows need [`RopePermute`]).
    pub fn tensor_data(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(&TensorInfo, std::borrow::Cow<'_, [u8]>)> {
        let (info, stored) = self.tensor_stored(name, expected)?;
        let data = match info.transcode {
            Some(t) => std::borrow::Cow::Owned(t.apply(&stored)),
            None => stored,
        };
        Ok((info, data))
    }

    /// The bytes of a tensor as stored (a [`Transcode`]d type not rewritten: our kernels take
    /// it so), after checking its shape and that its values or scales are finite (borrowed
    /// from the map, or reordered for a checkpoint whose Q/K rows need [`RopePermute`]).
    pub fn tensor_stored(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(&TensorInfo, std::borrow::Cow<'_, [u8]>)> {
        let info = self.tensor_info(name, "the model's architecture requires it")?;
        if info.shape != expected {
            return Err(GgufError::Shape {
                path: self.path.clone(),
                name: name.to_string(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        let bytes = &self.maps[info.file][info.offset as usize..(info.offset + info.size) as usize];
        // Map the tensor's pages in one call (as llama.cpp's MAP_POPULATE does for the whole
        // file) instead of one fault per 64 KiB on first touch; a kernel without
        // MADV_POPULATE_READ (before Linux 5.14) refuses it and the pages fault in as before.
        #[cfg(target_os = "linux")]
        let _ = self.maps[info.file].advise_range(
            memmap2::Advice::PopulateRead,
            info.offset as usize,
            info.size as usize,
        );
        let bad = match info.transcode {
            Some(t) => t.first_non_finite(bytes),
            None => crate::model::finite::first_non_finite(info.dtype, bytes),
        };
        if let Some(detail) = bad {
            return Err(GgufError::NonFinite {
                path: self.path.clone(),
                tensor: name.to_string(),
                detail,
            });
        }
        use std::borrow::Cow;
        let data = match info.permute {
            None => Cow::Borrowed(bytes),
            Some(p) => {
                let rows = info.shape[0].max(1);
                Cow::Owned(p.apply(bytes, bytes.len() / rows))
            }
        };
        Ok((info, data))
    }

    /// A whole tensor's bytes where they lie in the map, for a kernel that uses them in place
    /// (`None` for a checkpoint tensor whose rows are reordered at load).
    pub fn mapped_bytes(&self, info: &TensorInfo) -> Option<crate::model::mapped::MappedBytes> {
        if info.permute.is_some() {
            return None;
        }
        crate::model::mapped::MappedBytes::new(
            self.maps.get(info.file)?.clone(),
            usize::try_from(info.offset).ok()?,
            usize::try_from(info.size).ok()?,
        )
    }

    /// Drops a tensor's mapped pages from the resident set once its bytes have been copied
    /// into the engine's storage, so that loading never holds the weights twice.
    pub fn release(&self, info: &TensorInfo) {
        // SAFETY: a read-only file mapping; a later read faults the pages back in from the file.
        #[cfg(unix)]
        unsafe {
            let _ = self.maps[info.file].unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                info.offset as usize,
                info.size as usize,
            );
        }
    }

    /// Loads a tensor into candle storage (the one copy out of the map), checking its shape.
    pub fn qtensor(&self, name: &str, expected: &[usize], device: &Device) -> Result<QTensor> {
        let (info, data) = self.tensor_data(name, expected)?;
        let candle_err = |source| GgufError::Candle {
            path: self.path.clone(),
            name: name.to_string(),
            source: Box::new(source),
        };
        let storage = QStorage::from_data(data, device, info.dtype).map_err(candle_err)?;
        self.release(info);
        QTensor::new(storage, info.shape.as_slice()).map_err(candle_err)
    }
}
