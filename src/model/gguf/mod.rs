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

use memmap2::Mmap;

mod metadata;
mod reader;
mod tensor_info;
#[cfg(test)]
pub(crate) mod tests;
pub mod transcode;

pub use metadata::Value;
pub use tensor_info::{ggml_dtype, ggml_type_id, ggml_type_name, RopePermute, TensorInfo};

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
    #[error("{path}: tensor '{tensor}' has type {type_name} (ggml type {type_id}), which ppl cannot compute with; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS; re-quantize the model to one of them")]
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
/// A parsed, memory-mapped GGUF file, or a Hugging Face checkpoint directory presented the
/// same way (GGUF tensor names and metadata keys; [`GgufFile::open`], in [`crate::model::file`],
/// picks the reader).
pub struct GgufFile {
    path: PathBuf,
    /// The mapped files: the GGUF file, or the checkpoint's safetensors shards.
    maps: Vec<std::sync::Arc<Mmap>>,
    /// For a Hugging Face checkpoint: its tokenizer files.
    pub hf_tokenizer: Option<crate::model::tokenizer_meta::HfTokenizerFiles>,
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

impl GgufFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Assembles a model from parts already parsed (a Hugging Face checkpoint).
    pub(crate) fn from_parts(
        path: &Path,
        maps: Vec<Mmap>,
        metadata: BTreeMap<String, Value>,
        tensors: BTreeMap<String, TensorInfo>,
        hf_tokenizer: Option<crate::model::tokenizer_meta::HfTokenizerFiles>,
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
}
