//! Benchmark tasks (`--task`): a published evaluation protocol reproduced exactly, so that
//! ppl's figures can be set beside the ones papers and model cards cite.
//!
//! A task fixes what the `rolling` method leaves open: which documents, what text of each is
//! scored, how words and bytes are counted, how the tokenizer is called and which window
//! length is used. So far one task: lm-evaluation-harness's `wikitext` ([`wikitext`]).
//!
//! [`prepare_documents`] turns the data into the token ids of each scored document (for plain
//! `rolling` too), with the word and byte counts its metrics divide by.

pub mod wikitext;

use std::path::Path;

use serde::Serialize;

use crate::data::{Data, Method};
use crate::model::{GgufFile, LlamaConfig, ModelError};
use crate::tokenize::{TokenizeError, Tokenizer};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("--task {task} scores with {want} windows ({why}), not --method {method}: drop --method (data.method) or set it to {want}")]
    Method {
        task: Task,
        method: Method,
        want: Method,
        why: &'static str,
    },
    #[error("--task {0} without --ctx uses the model's maximum length: give the model with --model (or model.path)")]
    NoModel(Task),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A benchmark task (`--task`, `task:` in YAML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// lm-evaluation-harness `wikitext`: WikiText-2's test pages, detokenized, scored with
    /// `loglikelihood_rolling`; word perplexity, byte perplexity and bits per byte.
    Wikitext,
    /// The GPTQ reference code's perplexity, the one quantization papers print: the
    /// dataset's rows joined as that code joins them (`--data wikitext-2`, `ptb`, `c4`),
    /// tokenized once, disjoint windows of `--ctx` (2048 by default), every token after each
    /// window's first scored, the remainder dropped.
    Gptq,
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Task::Wikitext => "wikitext",
            Task::Gptq => "gptq",
        })
    }
}

/// Where a task's window length came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowSource {
    /// The model's maximum length, as lm-eval's HF model takes it (`max_position_embeddings`
    /// of config.json, the GGUF's `context_length`).
    Model,
    /// `--ctx` (or `evaluation.max_seq_len`), like lm-eval's `max_length=` model argument.
    Flag,
    /// The protocol's own length (2048 for `gptq`, as the papers evaluate).
    Protocol,
}

/// The task of a run and where its window length came from (results.json `config.task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TaskSpec {
    pub name: Task,
    pub window: WindowSource,
}

/// The method and window length of a task run: always `rolling`; `ctx` when given (`--ctx`,
/// `evaluation.max_seq_len`: lm-eval's `max_length=`), else the model's maximum length as
/// lm-eval's HF model resolves it (`max_position_embeddings`; a GGUF's `context_length`),
/// which means reading the model's header (metadata only).
pub fn resolve_window(
    task: Task,
    method: Method,
    method_given: bool,
    ctx: Option<usize>,
    model: Option<&Path>,
) -> Result<(Method, usize, Option<TaskSpec>), TaskError> {
    let (want, why) = match task {
        Task::Wikitext => (Method::Rolling, "lm-eval's loglikelihood_rolling"),
        Task::Gptq => (Method::Disjoint, "the GPTQ reference code's"),
    };
    if method_given && method != want {
        return Err(TaskError::Method {
            task,
            method,
            want,
            why,
        });
    }
    if task == Task::Gptq {
        let (ctx, window) = match ctx {
            Some(c) => (c, WindowSource::Flag),
            None => (GPTQ_CTX, WindowSource::Protocol),
        };
        return Ok((Method::Disjoint, ctx, Some(TaskSpec { name: task, window })));
    }
    let (ctx, window) = match ctx {
        Some(c) => (c, WindowSource::Flag),
        None => {
            let model = model.ok_or(TaskError::NoModel(task))?;
            let g = GgufFile::open(model).map_err(ModelError::from)?;
            (
                LlamaConfig::from_gguf(&g)?.context_length,
                WindowSource::Model,
            )
        }
    };
    Ok((Method::Rolling, ctx, Some(TaskSpec { name: task, window })))
}

/// The window length of the GPTQ reference code's evaluation (its `seqlen`).
pub const GPTQ_CTX: usize = 2048;

/// One document ready for rolling windows: its token ids and the counts its metrics use.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedDocument {
    pub ids: Vec<u32>,
    pub words: u64,
    pub bytes: u64,
}

/// The documents of `data` as token ids, the first `limit` only.
///
/// Without a task (plain `rolling`): the data's documents as they are, tokenized without BOS.
/// With `wikitext`: the pages (the records of a record-based source, such as the dataset's
/// own Parquet file with `--text-field page`, else the text split by [`wikitext::pages`]),
/// each detokenized and tokenized as lm-eval's `HFLM.tok_encode` does, words and bytes
/// counted on the original page.
pub fn prepare_documents(
    task: Option<Task>,
    data: &Data,
    tok: &Tokenizer,
    prefix: u32,
    limit: Option<usize>,
) -> Result<Vec<PreparedDocument>, TokenizeError> {
    let limit = limit.unwrap_or(usize::MAX);
    match task {
        None | Some(Task::Gptq) => data
            .documents()
            .into_iter()
            .take(limit)
            .map(|d| {
                Ok(PreparedDocument {
                    ids: tok.encode_plain(d.text)?,
                    words: d.words,
                    bytes: d.bytes,
                })
            })
            .collect(),
        Some(Task::Wikitext) => {
            let split;
            let pages: Vec<&str> = match &data.doc_ranges {
                Some(ranges) => ranges.iter().map(|r| &data.text[r.clone()]).collect(),
                None => {
                    split = wikitext::pages(&data.text);
                    split.iter().map(AsRef::as_ref).collect()
                }
            };
            let prefix_text = tok.decode(&[prefix]);
            pages
                .into_iter()
                .take(limit)
                .map(|page| {
                    let target = wikitext::detokenize(page);
                    Ok(PreparedDocument {
                        ids: lm_eval_encode(tok, &target, &prefix_text)?,
                        words: crate::data::count_words(page),
                        bytes: page.len() as u64,
                    })
                })
                .collect()
        }
    }
}

/// `HFLM.tok_encode(string)` with its defaults: the tokenizer's own special tokens (BOS when
/// the tokenizer adds it), except when the text already starts with the prefix token's text.
fn lm_eval_encode(
    tok: &Tokenizer,
    text: &str,
    prefix_text: &str,
) -> Result<Vec<u32>, TokenizeError> {
    if !prefix_text.is_empty() && text.starts_with(prefix_text) {
        tok.encode_plain(text)
    } else {
        tok.encode(text)
    }
}
