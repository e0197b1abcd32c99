//! A strict reader for GGUF files (versions 2 and 3).
//!
//! The file is memory-mapped once; [`GgufFile`] holds the parsed header (metadata and tensor
//! directory) and hands out tensor bytes as slices of the map, so weights are copied at most
//! once, into the engine's own storage. Every way a file can be wrong (bad magic, truncated
//! header or data, a tensor type this build cannot compute with, inconsistent shapes) is a
//! [`GgufError`] that names the file and the tensor or key involved.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use memmap2::Mmap;

/// Errors from opening or reading a GGUF file. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open model file {path}: {source} (check the path given to --model)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (magic bytes {magic:?}, expected \"GGUF\"); convert the model to GGUF or pass a .gguf file")]
    BadMagic { path: PathBuf, magic: [u8; 4] },
    #[error("{path}: GGUF version {version} is not supported (versions 2 and 3 are); re-convert the model with a current llama.cpp")]
    Version { path: PathBuf, version: u32 },
    #[error("{path} is truncated or corrupt: {what} at byte {offset} runs past the end of the file ({len} bytes); re-download or re-convert the model")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        len: u64,
    },
    #[error("{path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path}: {detail}")]
    Checkpoint { path: PathBuf, detail: String },
    #[error("{path}: tensor '{tensor}' has type {type_name} (ggml type {type_id}), which ppl cannot compute with; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K; re-quantize the model to one of them")]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
        type_name: String,
    },
    #[error("{path}: tensor '{tensor}' holds a non-finite value ({detail}); the file is corrupt or was written from a diverged model — re-download or re-convert it")]
    NonFinite {
        path: PathBuf,
        tensor: String,
        detail: String,
    },
    #[error("{path}: metadata key '{key}' appears twice (as llama.cpp, ppl refuses to guess which value is meant); re-convert the model or remove the duplicate")]
    DuplicateKey { path: PathBuf, key: String },
    #[error("{path} is {kind}, not a model file; --model takes a GGUF file or a Hugging Face checkpoint directory")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("{path}: metadata key '{key}' is missing; the file does not describe {purpose}")]
    MissingKey {
        path: PathBuf,
        key: String,
        purpose: String,
    },
    #[error("{path}: metadata key '{key}' has type {found}, expected {expected}")]
    KeyType {
        path: PathBuf,
        key: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("{path}: tensor '{name}' is missing; {purpose}")]
    MissingTensor {
        path: PathBuf,
        name: String,
        purpose: String,
    },
    #[error("{path}: tensor '{name}' has shape {found:?}, expected {expected:?} from the model's metadata")]
    Shape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: cannot build tensor '{name}': {source}")]
    Candle {
        path: PathBuf,
        name: String,
        source: Box<candle_core::Error>,
    },
}

pub type Result<T> = std::result::Result<T, GgufError>;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer type, as `u64` when non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

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
    pub type_id: u32,
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

/// A parsed, memory-mapped GGUF file, or a Hugging Face checkpoint directory presented the
/// same way (GGUF tensor names and metadata keys; [`GgufFile::open`], in [`super::file`],
/// picks the reader).
pub struct GgufFile {
    path: PathBuf,
    /// The mapped files: the GGUF file, or the checkpoint's safetensors shards.
    maps: Vec<std::sync::Arc<Mmap>>,
    /// For a Hugging Face checkpoint: its tokenizer files.
    pub hf_tokenizer: Option<super::tokenizer_meta::HfTokenizerFiles>,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Bounds-checked little-endian cursor over the mapped bytes.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                len: self.bytes.len() as u64,
            }),
        }
    }
    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?
                .try_into()
                .expect("take(4) yields 4 bytes"),
        ))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?
                .try_into()
                .expect("take(8) yields 8 bytes"),
        ))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        let remaining = (self.bytes.len() - self.pos) as u64;
        if len > remaining {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: format!("{} (string of {len} bytes)", what()),
                offset: self.pos as u64,
                len: self.bytes.len() as u64,
            });
        }
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::Corrupt {
            path: self.path.to_path_buf(),
            detail: format!("{} is not valid UTF-8", what()),
        })
    }

    fn value(&mut self, type_id: u32, what: &dyn Fn() -> String, depth: usize) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(u16::from_le_bytes(
                self.take(2, what)?
                    .try_into()
                    .expect("take(2) yields 2 bytes"),
            )),
            3 => Value::I16(i16::from_le_bytes(
                self.take(2, what)?
                    .try_into()
                    .expect("take(2) yields 2 bytes"),
            )),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => Value::Bool(self.u8(what)? != 0),
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 0 {
                    return Err(GgufError::Corrupt {
                        path: self.path.to_path_buf(),
                        detail: format!("{} is an array nested deeper than ppl reads", what()),
                    });
                }
                let elem_type = self.u32(what)?;
                let len = self.u64(what)?;
                // Every element takes at least one byte: a length beyond the rest of the
                // file is corruption, not a reason to allocate.
                let remaining = (self.bytes.len() - self.pos) as u64;
                if len > remaining {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("{} (array of {len} elements)", what()),
                        offset: self.pos as u64,
                        len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_type, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            other => {
                return Err(GgufError::Corrupt {
                    path: self.path.to_path_buf(),
                    detail: format!("{} has unknown metadata value type {other}", what()),
                })
            }
        })
    }
}

const MAX_TENSORS: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;

impl GgufFile {
    /// Maps and parses the GGUF file `file`, opened from `path` (a model path is opened by
    /// [`GgufFile::open`], which also reads checkpoint directories).
    pub(super) fn map_gguf(path: &Path, file: &std::fs::File) -> Result<Self> {
        // SAFETY: the map is read-only; ppl never writes the file while it is mapped. A file
        // changed by another process under us is outside what any mmap-based loader can guard.
        let mmap = unsafe { Mmap::map(file) }.map_err(|source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, mmap)
    }

    fn parse(path: &Path, mmap: Mmap) -> Result<Self> {
        let bytes: &[u8] = &mmap;
        let mut cur = Cursor {
            path,
            bytes,
            pos: 0,
        };
        if bytes.len() < 4 {
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: "the GGUF magic".into(),
                offset: 0,
                len: bytes.len() as u64,
            });
        }
        let magic: [u8; 4] = bytes[..4].try_into().expect("length checked above");
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
                magic,
            });
        }
        cur.pos = 4;
        let version = cur.u32(&|| "the GGUF version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = cur.u64(&|| "the tensor count".into())?;
        let n_kv = cur.u64(&|| "the metadata count".into())?;
        if n_tensors > MAX_TENSORS || n_kv > bytes.len() as u64 {
            return Err(GgufError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("implausible header: {n_tensors} tensors, {n_kv} metadata keys"),
            });
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = cur.string(&|| format!("metadata key #{i}"))?;
            let what = || format!("the value of metadata key '{key}'");
            let type_id = cur.u32(&what)?;
            let value = cur.value(type_id, &what, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey {
                    path: path.to_path_buf(),
                    key,
                });
            }
            metadata.insert(key, value);
        }
        let mut infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = cur.string(&|| format!("the name of tensor #{i}"))?;
            let what = || format!("the directory entry of tensor '{name}'");
            let n_dims = cur.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("tensor '{name}' has {n_dims} dimensions (1..=4 allowed)"),
                });
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(cur.u64(&what)?);
            }
            let type_id = cur.u32(&what)?;
            let offset = cur.u64(&what)?;
            infos.push((name, ne, type_id, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::Corrupt {
                        path: path.to_path_buf(),
                        detail: format!("general.alignment is {v:?}, not a power of two"),
                    })
                }
            },
        };
        let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let mut tensors = BTreeMap::new();
        for (name, ne, type_id, rel_offset) in infos {
            let Some(dtype) = ggml_dtype(type_id) else {
                return Err(GgufError::UnsupportedType {
                    path: path.to_path_buf(),
                    tensor: name,
                    type_id,
                    type_name: ggml_type_name(type_id),
                });
            };
            let corrupt = |detail: String| GgufError::Corrupt {
                path: path.to_path_buf(),
                detail,
            };
            let mut elems: u64 = 1;
            for &d in &ne {
                elems = elems.checked_mul(d).ok_or_else(|| {
                    corrupt(format!("tensor '{name}' has dims {ne:?} that overflow"))
                })?;
            }
            let block = dtype.block_size() as u64;
            if ne[0] % block != 0 {
                return Err(corrupt(format!(
                    "tensor '{name}' has a row of {} elements, not a multiple of the {} block size {block}",
                    ne[0],
                    ggml_type_name(type_id)
                )));
            }
            let size = elems / block * dtype.type_size() as u64;
            let offset = data_start
                .checked_add(rel_offset)
                .ok_or_else(|| corrupt(format!("tensor '{name}' has offset {rel_offset}")))?;
            if offset % alignment != 0 {
                return Err(corrupt(format!(
                    "tensor '{name}' data offset {rel_offset} is not aligned to {alignment}"
                )));
            }
            match offset.checked_add(size) {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::Truncated {
                        path: path.to_path_buf(),
                        what: format!("the data of tensor '{name}' ({size} bytes)"),
                        offset,
                        len: file_len,
                    })
                }
            }
            let shape = ne.iter().rev().map(|&d| d as usize).collect();
            if tensors.contains_key(&name) {
                return Err(corrupt(format!("tensor '{name}' appears twice")));
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    shape,
                    type_id,
                    dtype,
                    offset,
                    size,
                    file: 0,
                    permute: None,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            maps: vec![std::sync::Arc::new(mmap)],
            hf_tokenizer: None,
            version,
            metadata,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Assembles a model from parts already parsed (a Hugging Face checkpoint).
    pub(crate) fn from_parts(
        path: &Path,
        maps: Vec<Mmap>,
        metadata: BTreeMap<String, Value>,
        tensors: BTreeMap<String, TensorInfo>,
        hf_tokenizer: Option<super::tokenizer_meta::HfTokenizerFiles>,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            maps: maps.into_iter().map(std::sync::Arc::new).collect(),
            hf_tokenizer,
            version: 3,
            metadata,
            tensors,
        }
    }

    /// Bytes of the mapped files (the model's size on disk).
    pub fn file_bytes(&self) -> u64 {
        self.maps.iter().map(|m| m.len() as u64).sum()
    }

    /// Files mapped: 1 for GGUF, the safetensors shards of a checkpoint.
    pub fn file_count(&self) -> usize {
        self.maps.len()
    }

    /// Whether this is a Hugging Face checkpoint directory rather than a GGUF file.
    pub fn is_hf(&self) -> bool {
        self.hf_tokenizer.is_some()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn missing(&self, key: &str, purpose: &str) -> GgufError {
        GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
            purpose: purpose.to_string(),
        }
    }

    fn wrong_type(&self, key: &str, v: &Value, expected: &'static str) -> GgufError {
        GgufError::KeyType {
            path: self.path.clone(),
            key: key.to_string(),
            found: v.type_name(),
            expected,
        }
    }

    pub fn get_str(&self, key: &str, purpose: &str) -> Result<&str> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(self.wrong_type(key, v, "string")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_u64(&self, key: &str, purpose: &str) -> Result<u64> {
        match self.get(key) {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| self.wrong_type(key, v, "unsigned integer")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_f64(&self, key: &str, purpose: &str) -> Result<f64> {
        match self.get(key) {
            Some(v) => v.as_f64().ok_or_else(|| self.wrong_type(key, v, "number")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A string array (tokens, merges).
    pub fn get_str_array(&self, key: &str, purpose: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(self.wrong_type(key, other, "array of strings")),
                })
                .collect(),
            Some(v) => Err(self.wrong_type(key, v, "array of strings")),
            None => Err(self.missing(key, purpose)),
        }
    }

    /// A numeric array (scores, token types) as f64.
    pub fn get_num_array(&self, key: &str, purpose: &str) -> Result<Vec<f64>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_f64()
                        .or(match v {
                            Value::I32(i) => Some(*i as f64),
                            _ => None,
                        })
                        .ok_or_else(|| self.wrong_type(key, v, "array of numbers"))
                })
                .collect(),
            Some(v) => Err(self.wrong_type(key, v, "array of numbers")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn tensor_info(&self, name: &str, purpose: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
                purpose: purpose.to_string(),
            })
    }

    /// The raw bytes of a tensor, after checking its shape (borrowed from the map, or
    /// reordered for a checkpoint whose Q/K rows need [`RopePermute`]).
    pub fn tensor_data(
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
        if let Some(detail) = super::finite::first_non_finite(info.dtype, bytes) {
            return Err(GgufError::NonFinite {
                path: self.path.clone(),
                tensor: name.to_string(),
                detail,
            });
        }
        Ok((
            info,
            match info.permute {
                None => std::borrow::Cow::Borrowed(bytes),
                Some(p) => {
                    let rows = info.shape[0].max(1);
                    std::borrow::Cow::Owned(p.apply(bytes, bytes.len() / rows))
                }
            },
        ))
    }

    /// A whole tensor's bytes where they lie in the map, for a kernel that uses them in place
    /// (`None` for a checkpoint tensor whose rows are reordered at load).
    pub fn mapped_bytes(&self, info: &TensorInfo) -> Option<super::mapped::MappedBytes> {
        if info.permute.is_some() {
            return None;
        }
        super::mapped::MappedBytes::new(
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a small GGUF image in memory: metadata and F32 tensors.
    pub(crate) fn build_gguf(
        kv: &[(&str, Value)],
        tensors: &[(&str, Vec<u64>, Vec<f32>)],
    ) -> Vec<u8> {
        fn put_str(out: &mut Vec<u8>, s: &str) {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        fn put_value(out: &mut Vec<u8>, v: &Value) {
            match v {
                Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
                Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
                Value::Bool(b) => out.push(*b as u8),
                Value::String(s) => put_str(out, s),
                Value::Array(items) => {
                    out.extend_from_slice(&type_id(&items[0]).to_le_bytes());
                    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                    for i in items {
                        put_value(out, i);
                    }
                }
                other => panic!("test builder does not write {other:?}"),
            }
        }
        fn type_id(v: &Value) -> u32 {
            match v {
                Value::U32(_) => 4,
                Value::F32(_) => 6,
                Value::Bool(_) => 7,
                Value::String(_) => 8,
                Value::Array(_) => 9,
                _ => unreachable!(),
            }
        }
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for (name, ne, data) in tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64 * 4).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, data) in tensors {
            for x in data {
                out.extend_from_slice(&x.to_le_bytes());
            }
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    fn sample() -> Vec<u8> {
        build_gguf(
            &[
                ("general.architecture", Value::String("llama".into())),
                ("llama.block_count", Value::U32(2)),
                (
                    "tokenizer.ggml.tokens",
                    Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
                ),
            ],
            &[("w", vec![4, 2], (0..8).map(|i| i as f32).collect())],
        )
    }

    #[test]
    fn reads_metadata_and_tensor_values() {
        let f = write(&sample());
        let g = GgufFile::open(f.path()).unwrap();
        assert_eq!(g.get_str("general.architecture", "").unwrap(), "llama");
        assert_eq!(g.get_u64("llama.block_count", "").unwrap(), 2);
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens", "").unwrap(),
            vec!["a", "b"]
        );
        let t = g.qtensor("w", &[2, 4], &Device::Cpu).unwrap();
        let v = t
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(v, vec![vec![0., 1., 2., 3.], vec![4., 5., 6., 7.]]);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample();
        for cut in 0..bytes.len() - 1 {
            let f = write(&bytes[..cut]);
            let err = GgufFile::open(f.path()).expect_err(&format!("cut at {cut}"));
            let msg = err.to_string();
            assert!(msg.contains(&f.path().display().to_string()), "{msg}");
        }
    }

    #[test]
    fn wrong_magic_and_shape_and_type_are_named() {
        let f = write(b"PK\x03\x04 this is a zip file, not a model");
        let msg = GgufFile::open(f.path()).unwrap_err().to_string();
        assert!(msg.contains("is not a GGUF file"), "{msg}");

        let f = write(&sample());
        let g = GgufFile::open(f.path()).unwrap();
        let msg = g
            .qtensor("w", &[4, 2], &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("tensor 'w' has shape [2, 4], expected [4, 2]"),
            "{msg}"
        );

        // Rewrite the type id of tensor 'w' (the u32 after its dims) to IQ2_XXS (16).
        let mut bytes = sample();
        let mut pattern = b"w".to_vec();
        pattern.extend_from_slice(&2u32.to_le_bytes());
        pattern.extend_from_slice(&4u64.to_le_bytes());
        let pos = bytes
            .windows(pattern.len())
            .position(|w| w == pattern.as_slice());
        let pos = pos.expect("tensor entry") + 1 + 4 + 16;
        bytes[pos..pos + 4].copy_from_slice(&16u32.to_le_bytes());
        let f = write(&bytes);
        let msg = GgufFile::open(f.path()).unwrap_err().to_string();
        assert!(msg.contains("tensor 'w' has type IQ2_XXS"), "{msg}");
    }
}
