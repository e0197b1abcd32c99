//! Tokenizers built from GGUF metadata (`tokenizer.ggml.*`), producing the same ids as
//! llama.cpp's `llama_tokenize(add_special = true, parse_special = false)`.
//!
//! - `gpt2` vocabularies (byte-level BPE): the `tokenizers` crate's BPE model with the
//!   pre-tokenizer named by `tokenizer.ggml.pre` (see [`bpe_pre_tokenizer`]).
//! - `llama` vocabularies (SentencePiece): llama.cpp's score-driven bigram merge with byte
//!   fallback, in [`spm`].
//!
//! A Hugging Face checkpoint's `tokenizer.json` is loaded by the `tokenizers` crate as it is
//! ([`Tokenizer::from_hf`]), with BOS as its post-processor or `tokenizer_config.json` adds it.
//!
//! As in llama.cpp, user-defined tokens (token type 4) are split out of the text before the
//! model sees it, even though special (control) tokens are not parsed.

mod export;
mod spm;

use rayon::prelude::*;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::model::GgufFile;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error(transparent)]
    Gguf(#[from] crate::model::GgufError),
    #[error("{path}: tokenizer model '{model}' is not supported (ppl reads 'gpt2' BPE and 'llama' SentencePiece vocabularies)")]
    UnsupportedModel {
        path: std::path::PathBuf,
        model: String,
    },
    #[error("{path}: BPE pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not supported; supported: {supported}")]
    UnsupportedPre {
        path: std::path::PathBuf,
        pre: String,
        supported: &'static str,
    },
    #[error("{path}: invalid tokenizer metadata: {detail}")]
    Invalid {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("tokenization failed: {0}")]
    Encode(String),
}

type Result<T> = std::result::Result<T, TokenizeError>;

enum Model {
    /// A `tokenizers` pipeline: byte-level BPE from GGUF, or a checkpoint's tokenizer.json.
    Tokenizers(Box<tokenizers::Tokenizer>),
    Spm(Box<spm::SpmModel>),
}

/// A tokenizer equivalent to the one llama.cpp builds from the same GGUF file.
pub struct Tokenizer {
    model: Model,
    /// User-defined tokens, longest first: matched in raw text before the model runs.
    user_defined: Vec<(String, u32)>,
    add_space_prefix: bool,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub add_bos: bool,
    pub kind: String,
    pub pre: Option<String>,
    pub vocab_size: usize,
    /// SHA-256 over everything that determines the ids (vocabulary, merges or scores, flags).
    pub fingerprint: String,
}

/// BPE pre-tokenizers ppl knows, by llama.cpp's `tokenizer.ggml.pre` name.
pub const SUPPORTED_PRE: &str =
    "default, gpt2, smollm, starcoder, refact, llama3, llama-bpe, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen";

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer for a `tokenizer.ggml.pre` name, or `None` when unknown.
///
/// `smollm` (and the other StarCoder-derived vocabularies) split every digit on its own before
/// GPT-2's byte-level split; this reproduces llama.cpp's ids exactly on wikitext.
pub fn bpe_pre_tokenizer(pre: &str) -> Option<PreTokenizerWrapper> {
    let byte_level = |use_regex| ByteLevel::new(false, false, use_regex);
    let regex_then_bytes = |re: &str| -> PreTokenizerWrapper {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .expect("built-in pre-tokenizer regex compiles");
        Sequence::new(vec![split.into(), byte_level(false).into()]).into()
    };
    Some(match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true).into(),
        "smollm" | "starcoder" | "refact" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into()
        }
        "llama3" | "llama-bpe" | "dbrx" | "smaug-bpe" => regex_then_bytes(LLAMA3_REGEX),
        "qwen2" | "deepseek-r1-qwen" => regex_then_bytes(QWEN2_REGEX),
        _ => return None,
    })
}

/// Bytes of text handed to a byte-level BPE tokenizer at once. The `tokenizers` crate keeps
/// about 90 bytes of bookkeeping per input byte while it encodes (offsets, alignments, token
/// strings): wikitext-2's 1.3 MB test file took 116 MB, the largest allocation of a whole
/// SmolLM2 evaluation.
const PIECE_BYTES: usize = 1 << 16;

/// The smallest piece when only a prefix of the text is wanted ([`Tokenizer::encode_at_least`]).
const MIN_PREFIX_PIECE_BYTES: usize = 1 << 12;

/// `text` cut into pieces of at least `target` bytes (the last may be shorter). A cut is made
/// only where the byte-level pre-tokenizers ppl builds (GPT-2's pattern, digit splitting,
/// Llama 3's and Qwen2's patterns) end a pre-token whether or not the text goes on:
/// - after a lone newline between two ASCII non-space characters (`x\n|Y`): the newline is
///   a pre-token of its own either way;
/// - between a whitespace run ending in a newline and a space that starts a word
///   (`\n| The`): the run is one pre-token (GPT-2's `\s+(?!\S)` stops before the space,
///   Llama 3's `\s*[\r\n]+` at the last newline), and so it is at the end of a piece;
///   wikitext's lines all start this way;
/// - before a space between two ASCII letters (`word| Next`): a word ends at its last letter
///   in every one of these patterns, and the next starts with its space (`' ?\p{L}+'`,
///   `[^\r\n\p{L}\p{N}]?\p{L}+`); no pre-token holds a letter followed by a space. This
///   keeps a text of one enormous line (no newline to cut at) in bounded memory.
///
/// So the pieces' ids are the whole text's ids (the whole-wikitext test checks this against
/// llama.cpp's ids).
fn pieces(text: &str, target: usize) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let solid = |b: u8| b.is_ascii_graphic();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let from = start.saturating_add(target).max(start + 2);
        let cut = (from..bytes.len())
            .find(|&i| {
                let space_word =
                    bytes[i] == b' ' && bytes.get(i + 1).is_some_and(u8::is_ascii_alphabetic);
                (bytes[i - 1] == b'\n' && ((solid(bytes[i - 2]) && solid(bytes[i])) || space_word))
                    || (space_word && bytes[i - 1].is_ascii_alphabetic())
            })
            .unwrap_or(bytes.len());
        let piece = &text[start..cut];
        start = cut;
        Some(piece)
    })
}

impl Tokenizer {
    /// The model's tokenizer: from GGUF metadata, or a checkpoint's `tokenizer.json`.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        if let Some(files) = &g.hf_tokenizer {
            return Self::from_hf(g.path(), files);
        }
        let purpose = "a tokenizer (tokenizer.ggml.*); convert the model with its tokenizer";
        let kind = g.get_str("tokenizer.ggml.model", purpose)?.to_string();
        let tokens = g.get_str_array("tokenizer.ggml.tokens", purpose)?;
        let token_types: Option<Vec<u32>> = match g.get("tokenizer.ggml.token_type") {
            Some(_) => Some(
                g.get_num_array("tokenizer.ggml.token_type", purpose)?
                    .into_iter()
                    .map(|t| t as u32)
                    .collect(),
            ),
            None => None,
        };
        let invalid = |detail: String| TokenizeError::Invalid {
            path: g.path().to_path_buf(),
            detail,
        };
        if let Some(tt) = &token_types {
            if tt.len() != tokens.len() {
                return Err(invalid(format!(
                    "{} token types for {} tokens",
                    tt.len(),
                    tokens.len()
                )));
            }
        }
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get(key) {
                None => Ok(None),
                Some(_) => {
                    let v = g.get_u64(key, purpose)?;
                    if v as usize >= tokens.len() {
                        return Err(invalid(format!("{key} = {v} is outside the vocabulary")));
                    }
                    Ok(Some(v as u32))
                }
            }
        };
        let bos_id = id("tokenizer.ggml.bos_token_id")?;
        let eos_id = id("tokenizer.ggml.eos_token_id")?;
        let mut user_defined: Vec<(String, u32)> = match &token_types {
            Some(tt) => tt
                .iter()
                .enumerate()
                .filter(|(_, &t)| t == TOKEN_TYPE_USER_DEFINED)
                .map(|(i, _)| (tokens[i].to_string(), i as u32))
                .filter(|(s, _)| !s.is_empty())
                .collect(),
            None => Vec::new(),
        };
        // Longest first, as llama.cpp orders its special-token cache.
        user_defined.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let (model, pre, default_add_bos, default_space_prefix) = match kind.as_str() {
            "gpt2" => {
                let pre = g
                    .get("tokenizer.ggml.pre")
                    .map(|_| g.get_str("tokenizer.ggml.pre", purpose))
                    .transpose()?
                    .unwrap_or("default")
                    .to_string();
                let pre_tok =
                    bpe_pre_tokenizer(&pre).ok_or_else(|| TokenizeError::UnsupportedPre {
                        path: g.path().to_path_buf(),
                        pre: pre.clone(),
                        supported: SUPPORTED_PRE,
                    })?;
                let merges = g.get_str_array("tokenizer.ggml.merges", purpose)?;
                let merges = merges
                    .iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                            .ok_or_else(|| invalid(format!("merge '{m}' is not two tokens")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let vocab: tokenizers::models::bpe::Vocab = tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.to_string(), i as u32))
                    .collect();
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab, merges)
                    .build()
                    .map_err(|e| invalid(format!("BPE vocabulary: {e}")))?;
                let mut tok = tokenizers::Tokenizer::new(bpe);
                tok.with_pre_tokenizer(Some(pre_tok));
                tok.with_decoder(Some(ByteLevel::default()));
                (Model::Tokenizers(Box::new(tok)), Some(pre), false, false)
            }
            "llama" => {
                let scores = g.get_num_array("tokenizer.ggml.scores", purpose)?;
                if scores.len() != tokens.len() {
                    return Err(invalid(format!(
                        "{} scores for {} tokens",
                        scores.len(),
                        tokens.len()
                    )));
                }
                let types = token_types.clone().unwrap_or_else(|| vec![1; tokens.len()]);
                let unk = id("tokenizer.ggml.unknown_token_id")?;
                (
                    Model::Spm(Box::new(spm::SpmModel::new(&tokens, &scores, &types, unk))),
                    None,
                    true,
                    true,
                )
            }
            _ => {
                return Err(TokenizeError::UnsupportedModel {
                    path: g.path().to_path_buf(),
                    model: kind,
                })
            }
        };
        let add_bos = g
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(default_add_bos);
        let add_space_prefix = g
            .get_bool("tokenizer.ggml.add_space_prefix")
            .unwrap_or(default_space_prefix);
        if add_bos && bos_id.is_none() {
            return Err(invalid(
                "add_bos_token is set but bos_token_id is missing".into(),
            ));
        }
        let fingerprint = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            h.update(
                format!("{kind}\0{pre:?}\0{add_bos}\0{add_space_prefix}\0{bos_id:?}\0").as_bytes(),
            );
            // The Debug text of each array, streamed into the hash (the same bytes as
            // hashing the formatted string, without building a string of the whole vocabulary).
            struct Hashing<'a>(&'a mut Sha256);
            impl std::fmt::Write for Hashing<'_> {
                fn write_str(&mut self, s: &str) -> std::fmt::Result {
                    self.0.update(s.as_bytes());
                    Ok(())
                }
            }
            for key in [
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges",
                "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type",
            ] {
                // Writing to a hash cannot fail.
                let _ = std::fmt::Write::write_fmt(
                    &mut Hashing(&mut h),
                    format_args!("{:?}", g.get(key)),
                );
            }
            crate::fingerprint::hex(&h.finalize())
        };
        Ok(Self {
            fingerprint,
            model,
            user_defined,
            add_space_prefix,
            bos_id,
            eos_id,
            add_bos,
            kind,
            pre,
            vocab_size: tokens.len(),
        })
    }

    /// A Hugging Face checkpoint's tokenizer (`tokenizer.json`, and `tokenizer_config.json`
    /// for BOS when the post-processor does not add it).
    pub fn from_hf(
        dir: &std::path::Path,
        files: &crate::model::tokenizer_meta::HfTokenizerFiles,
    ) -> Result<Self> {
        let path = files.tokenizer_json.as_ref().ok_or_else(|| TokenizeError::Invalid {
            path: dir.to_path_buf(),
            detail: "no tokenizer.json; ppl reads Hugging Face tokenizers in that format (write one with AutoTokenizer.from_pretrained(...).save_pretrained(dir))".into(),
        })?;
        let invalid = |p: &std::path::Path, detail: String| TokenizeError::Invalid {
            path: p.to_path_buf(),
            detail,
        };
        let bytes = std::fs::read(path).map_err(|e| invalid(path, e.to_string()))?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            invalid(
                path,
                format!("not a tokenizer.json the tokenizers crate reads: {e}"),
            )
        })?;
        let config: serde_json::Value = match &files.tokenizer_config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| invalid(p, e.to_string()))?;
                serde_json::from_str(&text)
                    .map_err(|e| invalid(p, format!("not valid JSON: {e}")))?
            }
            None => serde_json::Value::Null,
        };
        let special = |key: &str| -> Option<u32> {
            let v = config.get(key)?;
            let text = v
                .as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            tok.token_to_id(text)
        };
        // What the post-processor adds in front (BOS for Llama's tokenizer.json).
        let probe = |special: bool| {
            tok.encode_fast("a", special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizeError::Encode(e.to_string()))
        };
        let (with, without) = (probe(true)?, probe(false)?);
        let prefix = (with.len() > without.len() && with.ends_with(&without)).then(|| with[0]);
        let (add_bos, bos_id) = match prefix {
            Some(id) => (true, Some(id)),
            None => {
                let bos = special("bos_token");
                let add = config.get("add_bos_token").and_then(|v| v.as_bool()) == Some(true);
                if add && bos.is_none() {
                    return Err(invalid(
                        files.tokenizer_config.as_deref().unwrap_or(dir),
                        "add_bos_token is true but bos_token is not in the vocabulary".into(),
                    ));
                }
                (add, bos)
            }
        };
        let eos_id = special("eos_token");
        let kind = match serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|j| j.get("model")?.get("type")?.as_str().map(str::to_string))
        {
            Some(t) => format!("tokenizer.json ({t})"),
            None => "tokenizer.json".into(),
        };
        let fingerprint = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            h.update(format!("hf\0{add_bos}\0{bos_id:?}\0").as_bytes());
            h.update(&bytes);
            crate::fingerprint::hex(&h.finalize())
        };
        // `encode` adds BOS itself: the plain encoding must not add it again.
        Ok(Self {
            vocab_size: tok.get_vocab_size(true),
            model: Model::Tokenizers(Box::new(tok)),
            user_defined: Vec::new(),
            add_space_prefix: false,
            bos_id,
            eos_id,
            add_bos,
            kind,
            pre: None,
            fingerprint,
        })
    }

    /// The tokenizer as a `tokenizer.json` that gives the same ids (user-defined tokens as
    /// added tokens), where the `tokenizers` crate can express it (not SentencePiece here).
    pub fn hf_json(&self) -> Option<String> {
        let Model::Tokenizers(tok) = &self.model else {
            return None;
        };
        let mut tok = (**tok).clone();
        let added: Vec<tokenizers::AddedToken> = self
            .user_defined
            .iter()
            .map(|(s, _)| tokenizers::AddedToken::from(s.clone(), false))
            .collect();
        tok.add_tokens(&added);
        tok.to_string(false).ok()
    }

    /// The vocabulary entry of `id` (as `tokenizer.json` spells it).
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.model {
            Model::Tokenizers(tok) => tok.id_to_token(id),
            Model::Spm(_) => None,
        }
    }

    /// Token ids of `text`, with BOS first when the vocabulary asks for it
    /// (llama.cpp's `add_special = true`). Special tokens in the text are not parsed.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode_at_least(text, usize::MAX)?.ids)
    }

    /// The ids of the beginning of `text` (BOS first when the vocabulary asks for it): at
    /// least `min_tokens` of them, or all of the text's. Encoding stops only where the text's
    /// ids do not depend on what follows (between byte-level BPE pieces, see [`pieces`], or
    /// between fragments around user-defined tokens), so the ids are always a prefix of
    /// [`Tokenizer::encode`]'s: `--chunks 2` on a long text need not tokenize all of it.
    pub fn encode_at_least(&self, text: &str, min_tokens: usize) -> Result<Prefix> {
        let mut ids = Vec::with_capacity(text.len().min(min_tokens.saturating_mul(6)) / 3 + 1);
        if self.add_bos {
            ids.extend(self.bos_id);
        }
        let whole = self.encode_into(text, &mut ids, min_tokens)?;
        Ok(Prefix { ids, whole })
    }

    /// Text of `ids` (for excerpts in reports): byte-level BPE bytes or SentencePiece pieces
    /// (`▁` as space, `<0xXX>` as bytes), invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.model {
            Model::Tokenizers(tok) => tok.decode(ids, false).unwrap_or_default(),
            Model::Spm(spm) => spm.decode(ids),
        }
    }

    /// Token ids of `text` without BOS.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, &mut ids, usize::MAX)?;
        Ok(ids)
    }

    /// Appends the ids of `text` to `ids`, stopping at the first independent boundary where
    /// `ids` holds at least `limit` ids. True when the whole text was encoded.
    fn encode_into(&self, text: &str, ids: &mut Vec<u32>, limit: usize) -> Result<bool> {
        let mut prev_was_token = true;
        for fragment in partition(text, &self.user_defined) {
            if ids.len() >= limit {
                return Ok(false);
            }
            match fragment {
                Fragment::Token(id) => {
                    ids.push(id);
                    prev_was_token = true;
                }
                Fragment::Text(t) => {
                    match &self.model {
                        Model::Tokenizers(tok) => {
                            let rest_encoded = self.encode_bpe_pieces(tok, t, ids, limit)?;
                            if !rest_encoded {
                                return Ok(false);
                            }
                        }
                        Model::Spm(spm) => {
                            let prefixed;
                            let t = if self.add_space_prefix && prev_was_token {
                                prefixed = format!(" {t}");
                                prefixed.as_str()
                            } else {
                                t
                            };
                            spm.encode(t, ids);
                        }
                    }
                    prev_was_token = false;
                }
            }
        }
        Ok(true)
    }

    /// One text fragment through a `tokenizers` pipeline; true when all of it was encoded
    /// (false: stopped early with `limit` ids reached).
    fn encode_bpe_pieces(
        &self,
        tok: &tokenizers::Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        limit: usize,
    ) -> Result<bool> {
        // GGUF byte-level BPE (a known `pre`) may be fed in pieces; the pieces' ids are the
        // whole text's ids (see `pieces`), so they may be encoded at once on every core and
        // joined in order.
        let threads = rayon::current_num_threads().max(1);
        let piece_bytes = match (&self.pre, limit) {
            (None, _) => usize::MAX,
            (Some(_), usize::MAX) => PIECE_BYTES,
            // About 4 bytes a token in English text: a first round of one piece per thread
            // usually reaches the limit, and no round encodes much more than it needs.
            (Some(_), limit) => (limit.saturating_sub(ids.len()).saturating_mul(6) / threads)
                .clamp(MIN_PREFIX_PIECE_BYTES, PIECE_BYTES),
        };
        let mut pieces = pieces(text, piece_bytes).peekable();
        let round = if limit == usize::MAX {
            usize::MAX
        } else {
            threads
        };
        while pieces.peek().is_some() {
            if ids.len() >= limit {
                return Ok(false);
            }
            let batch: Vec<&str> = pieces.by_ref().take(round).collect();
            let encoded: Vec<Vec<u32>> = batch
                .par_iter()
                .map(|piece| {
                    tok.encode_fast(*piece, false)
                        .map(|enc| enc.get_ids().to_vec())
                        .map_err(|e| TokenizeError::Encode(e.to_string()))
                })
                .collect::<Result<_>>()?;
            for piece_ids in encoded {
                ids.extend_from_slice(&piece_ids);
            }
        }
        Ok(true)
    }
}

/// The beginning of a text's ids ([`Tokenizer::encode_at_least`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Prefix {
    pub ids: Vec<u32>,
    /// The whole text was encoded (`ids` are all of its ids).
    pub whole: bool,
}

#[derive(Debug, PartialEq)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Splits `text` around every occurrence of the given tokens, longest token first
/// (llama.cpp's `tokenizer_st_partition`).
fn partition<'a>(text: &'a str, tokens: &[(String, u32)]) -> Vec<Fragment<'a>> {
    let mut fragments = vec![Fragment::Text(text)];
    for (tok, id) in tokens {
        if !fragments
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(tok.as_str())))
        {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for f in fragments {
            match f {
                Fragment::Text(mut t) => {
                    while let Some(pos) = t.find(tok.as_str()) {
                        if pos > 0 {
                            next.push(Fragment::Text(&t[..pos]));
                        }
                        next.push(Fragment::Token(*id));
                        t = &t[pos + tok.len()..];
                    }
                    if !t.is_empty() {
                        next.push(Fragment::Text(t));
                    }
                }
                token => next.push(token),
            }
        }
        fragments = next;
    }
    fragments.retain(|f| !matches!(f, Fragment::Text("")));
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_cut_only_where_a_pre_token_ends() {
        let text = "ab\n\ncd\n 1f\ngh\n\u{a0}x\nyz \n \n Word\n  two\n";
        let got: Vec<&str> = pieces(text, 1).collect();
        assert_eq!(
            got,
            vec![
                "ab\n\ncd\n 1f\n",
                "gh\n\u{a0}x\n",
                "yz \n \n",
                " Word\n  two\n"
            ]
        );
        assert_eq!(got.concat(), text);
        assert_eq!(pieces(text, usize::MAX).collect::<Vec<_>>(), vec![text]);
        // One line: cut before the space of a word after a word, nowhere else.
        let line = "one two, 3 four.five six";
        assert_eq!(
            pieces(line, 1).collect::<Vec<_>>(),
            vec!["one", " two, 3 four.five", " six"]
        );
        assert_eq!(pieces("", 4).count(), 0);
    }

    #[test]
    fn partition_prefers_longest_token_and_keeps_text_order() {
        let toks = vec![("\t\t".to_string(), 2), ("\t".to_string(), 1)];
        let got = partition("a\t\t\tb\t", &toks);
        assert_eq!(
            got,
            vec![
                Fragment::Text("a"),
                Fragment::Token(2),
                Fragment::Token(1),
                Fragment::Text("b"),
                Fragment::Token(1)
            ]
        );
        assert_eq!(partition("", &toks), vec![]);
    }

    #[test]
    fn known_pre_tokenizers_build_and_unknown_is_none() {
        for pre in SUPPORTED_PRE.split(", ") {
            assert!(bpe_pre_tokenizer(pre).is_some(), "{pre}");
        }
        assert!(bpe_pre_tokenizer("jais").is_none());
    }
}
