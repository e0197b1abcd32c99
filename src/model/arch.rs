//! The architectures ppl implements, and what each is called and how it differs in GGUF files
//! and in Hugging Face checkpoints: written once here, instead of string comparisons spread
//! over the GGUF reader, the checkpoint reader and the checkpoint writer.

use std::fmt;

/// One architecture, as a GGUF file's `general.architecture` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    Llama,
    Mistral,
    /// Qwen2/2.5: biases on Q, K and V; NeoX-style rotation.
    Qwen2,
    /// Qwen3: Q/K norms; NeoX-style rotation.
    Qwen3,
    /// Gemma 3 (text): Q/K norms, post-attention and post-FFN norms, GELU, sliding layers.
    Gemma3,
}

/// `general.architecture` values ppl reads (for error messages).
pub const SUPPORTED_ARCHITECTURES: &str = "llama, mistral, qwen2, qwen3, gemma3";
/// `config.json` `model_type` values ppl reads (for error messages).
pub const SUPPORTED_MODEL_TYPES: &str = "llama, mistral, qwen2, qwen3, gemma3_text";

impl Arch {
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
    ];

    /// The GGUF `general.architecture` value (also the prefix of its hyper-parameter keys).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }

    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.gguf_name() == name)
    }

    /// `config.json`'s `model_type`.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3_text",
            other => other.gguf_name(),
        }
    }

    pub fn from_hf_model_type(model_type: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.hf_model_type() == model_type)
    }

    /// `config.json`'s `architectures[0]`: the transformers class of the causal LM.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// Whether the Q and K rows are stored in another order in GGUF than in the checkpoint:
    /// llama.cpp's converter permutes them for its Llama-style (interleaved) rotation.
    pub fn hf_permutes_qk(self) -> bool {
        matches!(self, Arch::Llama | Arch::Mistral)
    }

    /// Whether rotary embeddings rotate the two halves of a head (NeoX style) rather than
    /// adjacent pairs.
    pub fn rope_neox(self) -> bool {
        matches!(self, Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3)
    }

    /// Whether a sliding attention window in the metadata applies (Mistral's, Gemma 3's
    /// local layers); other architectures' files may carry one that their attention ignores.
    pub fn has_sliding_window(self) -> bool {
        matches!(self, Arch::Mistral | Arch::Gemma3)
    }

    pub fn is_gemma(self) -> bool {
        self == Arch::Gemma3
    }
}

impl serde::Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.gguf_name())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.gguf_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_supported_lists_name_every_architecture() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_gguf_name(a.gguf_name()), Some(a));
            assert_eq!(Arch::from_hf_model_type(a.hf_model_type()), Some(a));
            assert!(SUPPORTED_ARCHITECTURES
                .split(", ")
                .any(|n| n == a.gguf_name()));
            assert!(SUPPORTED_MODEL_TYPES
                .split(", ")
                .any(|n| n == a.hf_model_type()));
        }
        assert_eq!(SUPPORTED_ARCHITECTURES.split(", ").count(), Arch::ALL.len());
        assert_eq!(SUPPORTED_MODEL_TYPES.split(", ").count(), Arch::ALL.len());
        assert_eq!(Arch::from_gguf_name("gemma3_text"), None);
        assert_eq!(Arch::from_hf_model_type("gemma3"), None);
        assert_eq!(Arch::from_gguf_name("phi3"), None);
    }
}
