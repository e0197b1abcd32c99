//! Tokenizer metadata as the model layer carries and writes it, as plain data: the tokenizer
//! files a checkpoint directory holds ([`HfTokenizerFiles`]), and a tokenizer in the form a
//! checkpoint writer puts in a directory ([`CheckpointTokenizer`]).
//!
//! The tokenizer code ([`crate::tokenize`]) builds on the model file (its vocabulary is GGUF
//! metadata), so the model layer does not call it: the writers take the tokenizer through
//! [`ExportTokenizer`], which `crate::tokenize` implements for a model file and for a built
//! tokenizer.

use std::path::PathBuf;

use serde_json::{json, Value as Json};

/// The tokenizer files of a checkpoint directory.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTokenizerFiles {
    /// `tokenizer.json` (the `tokenizers` crate's format), if present.
    pub tokenizer_json: Option<PathBuf>,
    /// `tokenizer_config.json` (BOS/EOS and whether BOS is added), if present.
    pub tokenizer_config: Option<PathBuf>,
}

/// A tokenizer as a Hugging Face checkpoint stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointTokenizer {
    /// `tokenizer.json`, where the `tokenizers` crate can express the tokenizer (not
    /// SentencePiece here).
    pub tokenizer_json: Option<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// The vocabulary entries of BOS and EOS (as `tokenizer.json` spells them).
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub add_bos: bool,
    /// The tokenizer's kind (`gpt2`, `llama`, …), for messages.
    pub kind: String,
}

impl CheckpointTokenizer {
    /// `tokenizer_config.json`: the class transformers loads `tokenizer.json` with, and BOS.
    pub fn tokenizer_config_json(&self) -> Json {
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        })
    }
}

/// What has a tokenizer that a checkpoint writer can store (implemented in
/// [`crate::tokenize`]).
pub trait ExportTokenizer {
    /// The tokenizer in checkpoint form, or why it cannot be built (for messages).
    fn checkpoint_tokenizer(&self) -> Result<CheckpointTokenizer, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_config_names_the_fast_tokenizer_and_bos() {
        let tok = CheckpointTokenizer {
            tokenizer_json: None,
            bos_id: Some(1),
            eos_id: Some(2),
            bos_token: Some("<s>".into()),
            eos_token: None,
            add_bos: true,
            kind: "gpt2".into(),
        };
        assert_eq!(
            tok.tokenizer_config_json(),
            json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "add_bos_token": true,
                "bos_token": "<s>",
                "eos_token": null,
            })
        );
    }
}
