//! The model file a `--model` path names, opened by the reader its kind needs: a GGUF file
//! ([`super::gguf`]) or a Hugging Face checkpoint directory ([`super::hf`]), both presented as
//! one [`GgufFile`] (GGUF tensor names and metadata keys).
//!
//! This is the one module that knows both readers: the checkpoint reader builds on the GGUF
//! representation, and the GGUF reader knows nothing of checkpoints.

use std::path::Path;

use super::gguf::{GgufError, GgufFile};
use super::hf;

impl GgufFile {
    /// Maps and parses `path`: a GGUF file, or a Hugging Face checkpoint directory
    /// (`config.json`, safetensors). Tensor data is not touched until it is read.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let open_err = |source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        };
        // A FIFO would block open() forever and a device reads without end: refused by
        // their type, which stat tells without opening anything.
        if let Some(kind) = crate::preflight::special_file_kind(path) {
            return Err(GgufError::NotAFile {
                path: path.to_path_buf(),
                kind,
            });
        }
        let file = std::fs::File::open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if meta.is_dir() {
            return hf::open_dir(path);
        }
        Self::map_gguf(path, &file)
    }
}
