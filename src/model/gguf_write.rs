//! Writing GGUF files: `ppl export --dtype f32|f16|bf16` (a float copy of any supported GGUF,
//! dequantizing) and `ppl quantize IN OUT --type …` (the weights quantized as `--quantize`
//! does at load, written where the type exists in GGUF).
//!
//! The metadata is copied as is, except `general.file_type` (llama.cpp's name for the
//! dominant type) and `general.quantization_version`. One-dimensional tensors (norms, biases)
//! stay F32, as llama.cpp keeps them. The container is written by candle's GGUF writer
//! (labelled version 3, as the layout is; 32-byte alignment); every tensor is converted before the file is created and
//! the file is renamed into place at the end, so a failure leaves no partial output.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use super::gguf::{GgufFile, Value};
use super::quantize::{Quantize, Scheme, Site};

/// What a written file's tensors become.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Conversion {
    /// Every matrix dequantized and stored in this float type (`ppl export`).
    Float(GgmlDType),
    /// Matrices quantized as [`Quantize`] selects them (`ppl quantize`); the others kept as
    /// stored. For a tied embedding (no `output.weight`) the one table follows the output
    /// layer's choice, as llama.cpp's quantizer does.
    Quantize(Quantize),
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Unsupported(String),
    #[error("cannot convert tensor '{name}' of {path}: {source}")]
    Tensor {
        path: PathBuf,
        name: String,
        source: Box<candle_core::Error>,
    },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] super::gguf::GgufError),
}

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub tensors: usize,
    pub bytes: u64,
    /// (tensor name, type written), in the file's order.
    pub types: Vec<(String, crate::model::gguf::transcode::StoredType)>,
}

/// llama.cpp's `general.file_type` for a file whose matrices are mostly `dtype`.
fn file_type(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q8_0 => 7,
        GgmlDType::Q5_0 => 8,
        GgmlDType::Q5_1 => 9,
        // Q3_K (Q4_K) everywhere it fits is llama.cpp's Q3_K_S (Q4_K_S).
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 14,
        GgmlDType::Q6K => 18,
        GgmlDType::BF16 => 32,
        _ => 0,
    }
}

fn to_candle(v: &Value) -> gguf_file::Value {
    use gguf_file::Value as C;
    match v {
        Value::U8(x) => C::U8(*x),
        Value::I8(x) => C::I8(*x),
        Value::U16(x) => C::U16(*x),
        Value::I16(x) => C::I16(*x),
        Value::U32(x) => C::U32(*x),
        Value::I32(x) => C::I32(*x),
        Value::U64(x) => C::U64(*x),
        Value::I64(x) => C::I64(*x),
        Value::F32(x) => C::F32(*x),
        Value::F64(x) => C::F64(*x),
        Value::Bool(x) => C::Bool(*x),
        Value::String(x) => C::String(x.clone()),
        Value::Array(items) => C::Array(items.iter().map(to_candle).collect()),
    }
}

/// The type tensor `name` (`shape` outermost first) is written in, or `None` to keep it as
/// stored.
fn target_type(
    conversion: &Conversion,
    name: &str,
    shape: &[usize],
    tied: bool,
    n_layers: usize,
) -> Option<GgmlDType> {
    let cols = *shape.last()?;
    if shape.len() != 2 {
        // Norms and biases: F32 (a float export converts them only from another type).
        return Some(GgmlDType::F32);
    }
    match conversion {
        Conversion::Float(d) => Some(*d),
        Conversion::Quantize(q) => {
            let wanted = match name {
                "output.weight" => q.output,
                "token_embd.weight" => q.covers_embeddings(tied),
                _ => true,
            };
            let output = name == "output.weight" || (tied && name == "token_embd.weight");
            let site = Site {
                name,
                n_layers,
                output,
            };
            if wanted {
                q.ggml_type(&site, cols)
            } else {
                None
            }
        }
    }
}

/// Converts every tensor of `src` and writes the result to `out`.
pub fn write(src: &GgufFile, out: &Path, conversion: &Conversion) -> Result<Written, WriteError> {
    if src.is_hf() {
        return Err(WriteError::Unsupported(format!(
            "{} is a Hugging Face checkpoint: ppl writes GGUF files from GGUF files only (the GGUF tokenizer metadata comes from llama.cpp's convert_hf_to_gguf.py); evaluate the directory directly, or use `ppl export --format safetensors` to change its dtype",
            src.path().display()
        )));
    }
    let main_type = match conversion {
        Conversion::Float(d) => {
            if !matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
                return Err(WriteError::Unsupported(format!(
                    "--dtype {d:?}: export writes f32, f16 or bf16"
                )));
            }
            *d
        }
        Conversion::Quantize(q) => q.scheme.ggml().ok_or_else(|| {
            WriteError::Unsupported(format!(
                "{} has no GGUF type (GGUF stores q4_0, q4_1, q8_0, q2_k, q3_k, q4_k and q6_k); evaluate it with `ppl eval --quantize {}` instead",
                q.scheme, q.scheme
            ))
        })?,
    };
    let tied = !src.tensors.contains_key("output.weight");
    // Blocks, from the `blk.N.` names (for the mixes' per-layer rules).
    let n_layers = src
        .tensors
        .keys()
        .filter_map(|n| {
            n.strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |i| i + 1);
    let tensor_err = |name: &str| {
        let (path, name) = (src.path().to_path_buf(), name.to_string());
        move |source| WriteError::Tensor {
            path: path.clone(),
            name: name.clone(),
            source: Box::new(source),
        }
    };
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(src.tensors.len());
    for (name, info) in &src.tensors {
        let q = src.qtensor(name, &info.shape, &Device::Cpu)?;
        let q = match target_type(conversion, name, &info.shape, tied, n_layers) {
            Some(dtype) if dtype != info.dtype || matches!(conversion, Conversion::Quantize(_)) => {
                let f = q.dequantize(&Device::Cpu).map_err(tensor_err(name))?;
                QTensor::quantize(&f, dtype).map_err(tensor_err(name))?
            }
            _ => q,
        };
        tensors.push((name.clone(), q));
    }
    let mut metadata: Vec<(String, gguf_file::Value)> = src
        .metadata
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "general.file_type" | "general.quantization_version"
            )
        })
        .map(|(k, v)| (k.clone(), to_candle(v)))
        .collect();
    let file_type = match conversion {
        // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M.
        Conversion::Quantize(q) if q.scheme == Scheme::Q4KM => 15,
        _ => file_type(main_type),
    };
    metadata.push(("general.file_type".into(), gguf_file::Value::U32(file_type)));
    if matches!(conversion, Conversion::Quantize(_)) {
        metadata.push((
            "general.quantization_version".into(),
            gguf_file::Value::U32(2),
        ));
    }
    let io = |source| WriteError::Io {
        path: out.to_path_buf(),
        source,
    };
    let tmp = out.with_extension("gguf.tmp");
    let result = (|| -> Result<(), WriteError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io)?;
        let mut f = std::io::BufWriter::new(file);
        let md: Vec<(&str, &gguf_file::Value)> =
            metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut f, &md, &ts).map_err(|source| WriteError::Tensor {
            path: out.to_path_buf(),
            name: "(container)".into(),
            source: Box::new(source),
        })?;
        let mut file = f.into_inner().map_err(|e| io(e.into_error()))?;
        mark_version_3(&mut file).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, out).map_err(io)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    Ok(Written {
        tensors: tensors.len(),
        bytes: std::fs::metadata(out).map_or(0, |m| m.len()),
        types: tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.dtype().into()))
            .collect(),
    })
}

/// candle's writer labels its files GGUF version 2; their little-endian layout is exactly
/// version 3's (v3 only added big-endian files), so the label is raised to 3, the version
/// llama.cpp writes and the input files carry.
fn mark_version_3(file: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut head = [0u8; 8];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut head)?;
    if &head[..4] != b"GGUF" || u32::from_le_bytes([head[4], head[5], head[6], head[7]]) != 2 {
        return Ok(());
    }
    file.seek(SeekFrom::Start(4))?;
    file.write_all(&3u32.to_le_bytes())?;
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quantize::Scheme;

    #[test]
    fn which_tensors_a_quantization_touches() {
        let q = Quantize {
            scheme: Scheme::Q4K,
            group_size: 32,
            embeddings: false,
            output: true,
        };
        let c = Conversion::Quantize(q);
        assert_eq!(
            target_type(&c, "blk.0.attn_q.weight", &[576, 576], true, 30),
            Some(GgmlDType::Q5_0)
        );
        assert_eq!(
            target_type(&c, "blk.0.ffn_down.weight", &[576, 1536], true, 30),
            Some(GgmlDType::Q4K)
        );
        assert_eq!(
            target_type(&c, "blk.0.attn_norm.weight", &[576], true, 30),
            Some(GgmlDType::F32)
        );
        // Tied: the table follows the output layer.
        assert_eq!(
            target_type(&c, "token_embd.weight", &[49152, 576], true, 30),
            Some(GgmlDType::Q5_0)
        );
        assert_eq!(
            target_type(&c, "token_embd.weight", &[49152, 576], false, 30),
            None
        );
        // q4_k_m: Q6_K for attn_v/ffn_down of the layers use_more_bits picks (0..3, 26..29
        // and 3 + 3k + 2 for 30 layers), Q4_K elsewhere; the fallbacks for rows of 576.
        let m = Conversion::Quantize(Quantize {
            scheme: Scheme::Q4KM,
            ..q
        });
        let down = |i: usize| {
            target_type(
                &m,
                &format!("blk.{i}.ffn_down.weight"),
                &[576, 1536],
                true,
                30,
            )
        };
        let picked: Vec<usize> = (0..30)
            .filter(|&i| down(i) == Some(GgmlDType::Q6K))
            .collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
        assert_eq!(down(3), Some(GgmlDType::Q4K));
        assert_eq!(
            target_type(&m, "blk.0.attn_v.weight", &[192, 576], true, 30),
            Some(GgmlDType::Q8_0)
        );
        assert_eq!(
            target_type(&m, "blk.3.attn_v.weight", &[192, 576], true, 30),
            Some(GgmlDType::Q5_0)
        );
        assert_eq!(
            target_type(&m, "token_embd.weight", &[49152, 576], true, 30),
            Some(GgmlDType::Q8_0)
        );
        let f = Conversion::Float(GgmlDType::BF16);
        assert_eq!(
            target_type(&f, "token_embd.weight", &[49152, 576], true, 30),
            Some(GgmlDType::BF16)
        );
    }
}
