//! The tokenizer in the form a checkpoint writer stores it ([`CheckpointTokenizer`]): the
//! model layer's writers take it through [`ExportTokenizer`], implemented here for a built
//! [`Tokenizer`] and for a model file (whose tokenizer is built first).

use crate::model::tokenizer_meta::{CheckpointTokenizer, ExportTokenizer};
use crate::model::GgufFile;

use super::Tokenizer;

impl ExportTokenizer for Tokenizer {
    fn checkpoint_tokenizer(&self) -> Result<CheckpointTokenizer, String> {
        let token = |id: Option<u32>| id.and_then(|i| self.token_text(i));
        Ok(CheckpointTokenizer {
            tokenizer_json: self.hf_json(),
            bos_id: self.bos_id,
            eos_id: self.eos_id,
            bos_token: token(self.bos_id),
            eos_token: token(self.eos_id),
            add_bos: self.add_bos,
            kind: self.kind.clone(),
        })
    }
}

impl ExportTokenizer for GgufFile {
    fn checkpoint_tokenizer(&self) -> Result<CheckpointTokenizer, String> {
        Tokenizer::from_gguf(self)
            .map_err(|e| e.to_string())?
            .checkpoint_tokenizer()
    }
}
