//! Models: the GGUF container ([`gguf`], written by [`gguf_write`]), the Llama-family architecture ([`llama`]) and the
//! fetcher for the reference test model ([`fetch`]).
//!
//! [`Precision`] selects how weights are used: `native` keeps quantized weights as stored
//! (activations are quantized to 8 bits inside each dot product, as llama.cpp does), `f32`
//! dequantizes every weight once at load and computes in f32 (the exact value of the model as
//! stored), `bf16`/`f16` round the weights to that type and compute every activation in it
//! (as a framework's bf16/f16 evaluation does; the logits' log-softmax stays f64).
//!
//! [`DeviceSpec`] selects where: the CPU, or a GPU through candle's CUDA backend
//! ([`device`], cargo feature `cuda`).

pub mod arch;
pub mod block_tensors;
pub mod config;
pub mod device;
pub mod fetch;
pub mod file;
pub mod finite;
pub mod gguf;
pub mod gguf_write;
pub mod heap;
pub mod hf;
pub mod hf_write;
pub mod kernels;
pub mod llama;
pub mod mapped;
pub mod memory;
pub mod quantize;
pub mod ring_attention;
pub mod rope_scaling;
pub mod shard;
pub mod synth;
pub mod tokenizer_meta;

pub use arch::Arch;
pub use config::LlamaConfig;
pub use device::{DeviceError, DeviceSpec};
pub use gguf::{GgufError, GgufFile};
pub use llama::{Collectives, Kernels, Llama};
pub use quantize::{Quantize, Scheme};
pub use shard::Partition;

/// How weights are computed with.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Quantized weights used as stored (llama.cpp's CPU path).
    Native,
    /// Every weight dequantized to f32 at load; f32 activations.
    F32,
    /// Weights rounded to bf16 at load; bf16 activations (matmuls accumulate in f32).
    Bf16,
    /// Weights rounded to f16 at load; f16 activations.
    F16,
}

impl Precision {
    /// The dtype of the activations (and of dense weights).
    pub fn dtype(self) -> candle_core::DType {
        match self {
            Precision::Native | Precision::F32 => candle_core::DType::F32,
            Precision::Bf16 => candle_core::DType::BF16,
            Precision::F16 => candle_core::DType::F16,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Native => "native",
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        })
    }
}

/// Errors building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: architecture '{arch}' is not supported; ppl evaluates: {supported}")]
    UnsupportedArchitecture {
        path: std::path::PathBuf,
        arch: String,
        supported: &'static str,
    },
    #[error("{path}: {detail}")]
    Invalid {
        path: std::path::PathBuf,
        detail: String,
    },
    /// A tensor that cannot be used as it is stored (the file is named by the caller, which
    /// knows it).
    #[error("tensor '{name}': {detail}")]
    Tensor { name: String, detail: String },
    /// A state of the run that no file caused (a rank asked for what it does not hold, a
    /// peer's data of the wrong size, a token outside the vocabulary).
    #[error("{0}")]
    Run(String),
    #[error("tensor computation failed: {0}")]
    Candle(Box<candle_core::Error>),
    /// A collective of a split model's forward pass failed (a lost rank, a timeout, a
    /// malformed message): the communicator's own error, so that the run reports it as it
    /// reports any other communication failure (see `RunError`'s and `EvalError`'s
    /// conversions from this type).
    #[error(transparent)]
    Comm(#[from] crate::comm::CommError),
    #[error("window {window} (text tokens from {start}): the model produced a non-finite NLL ({value}) at scored token {token}; its weights or activations overflowed, so no perplexity can be computed — check the model file (`ppl inspect`, or re-download it), or try --precision f32")]
    NonFinite {
        window: usize,
        start: usize,
        token: usize,
        value: f64,
    },
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Candle(Box::new(e))
    }
}
