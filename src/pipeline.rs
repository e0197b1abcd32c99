//! The evaluation pipeline, end to end: read the model header and tokenizer, read and
//! tokenize the text, cut windows, load the weights, score, and assemble [`Results`].
//!
//! Cheap checks (configuration, model metadata, data) all run before the weights are loaded,
//! so a bad input fails in well under a second, never after minutes of compute.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::data::{self, windows, DataError, Method, WindowPlan};
use crate::eval::{self, stats, NllAccumulator};
use crate::fingerprint;
use crate::model::{gguf, GgufFile, Llama, LlamaConfig, ModelError, Precision};
use crate::report::progress::{Progress, ProgressMode};
use crate::report::{DataInfo, ModelInfo, Results, SystemInfo, Timings, WindowRecord, SCHEMA_VERSION};
use crate::tokenize::{TokenizeError, Tokenizer};

/// A fully resolved evaluation configuration (defaults applied, ranges checked).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalConfig {
    pub model: PathBuf,
    pub data: PathBuf,
    pub method: Method,
    pub ctx: usize,
    /// Step between windows for `stride`.
    pub stride: usize,
    /// At most this many windows (`chunks`, `stride`) or documents (`rolling`).
    pub chunks: Option<usize>,
    /// Only the first N tokens of the text (`chunks`, `stride`).
    pub max_tokens: Option<usize>,
    pub batch_size: usize,
    pub threads: usize,
    pub precision: Precision,
    pub seed: u64,
    pub bootstrap_samples: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{0}")]
    Config(String),
}

/// What the text became before any weight is loaded.
struct Prepared {
    plan: WindowPlan,
    documents: Option<(u64, u64, u64)>,
}

fn prepare(cfg: &EvalConfig, tok: &Tokenizer, text: &str) -> Result<Prepared, EvalError> {
    let too_short = |n: usize, need: usize| {
        EvalError::Data(DataError::Windows(format!(
            "{}: the text has {n} tokens, fewer than the {need} one window needs with --ctx {}; use a smaller --ctx or a longer text",
            cfg.data.display(),
            cfg.ctx
        )))
    };
    match cfg.method {
        Method::Chunks | Method::Stride => {
            let mut tokens = tok.encode(text)?;
            if let Some(m) = cfg.max_tokens {
                tokens.truncate(m);
            }
            let ws = if cfg.method == Method::Chunks {
                if tokens.len() < cfg.ctx {
                    return Err(too_short(tokens.len(), cfg.ctx));
                }
                let bos = if tok.add_bos { tok.bos_id } else { None };
                windows::chunks(&tokens, cfg.ctx, cfg.chunks, bos)
            } else {
                if tokens.len() < 2 {
                    return Err(too_short(tokens.len(), 2));
                }
                let mut ws = windows::strided(&tokens, cfg.ctx, cfg.stride);
                if let Some(n) = cfg.chunks {
                    ws.truncate(n);
                }
                ws
            };
            Ok(Prepared {
                plan: WindowPlan {
                    windows: ws,
                    stream_tokens: tokens.len(),
                },
                documents: None,
            })
        }
        Method::Rolling => {
            let prefix = tok.bos_id.or(tok.eos_id).ok_or_else(|| {
                EvalError::Config(format!(
                    "{}: the vocabulary has neither a BOS nor an EOS token to start rolling windows with; use --method chunks",
                    cfg.model.display()
                ))
            })?;
            let mut docs = data::documents(text);
            if let Some(n) = cfg.chunks {
                docs.truncate(n);
            }
            let (mut ws, mut stream, mut words, mut bytes) = (Vec::new(), 0, 0, 0);
            for (d, doc) in docs.iter().enumerate() {
                let ids = tok.encode_plain(doc.text)?;
                stream += ids.len();
                words += doc.words;
                bytes += doc.bytes;
                let first = ws.len();
                ws.extend(windows::rolling(&ids, cfg.ctx, prefix, d, first));
            }
            Ok(Prepared {
                plan: WindowPlan {
                    windows: ws,
                    stream_tokens: stream,
                },
                documents: Some((docs.len() as u64, words, bytes)),
            })
        }
    }
}

/// Checks the configuration against the model before anything heavy happens.
fn check_config(cfg: &EvalConfig, mc: &LlamaConfig) -> Result<(), EvalError> {
    if cfg.ctx < 2 {
        return Err(EvalError::Config(format!(
            "--ctx {} is too small: a window needs at least 2 tokens (one to condition on, one to score)",
            cfg.ctx
        )));
    }
    if cfg.ctx > mc.context_length {
        return Err(EvalError::Config(format!(
            "--ctx {} exceeds the model's context length {} ({}.context_length in {}); use --ctx {} or less",
            cfg.ctx,
            mc.context_length,
            mc.architecture,
            cfg.model.display(),
            mc.context_length
        )));
    }
    if cfg.method == Method::Stride && (cfg.stride == 0 || cfg.stride > cfg.ctx) {
        return Err(EvalError::Config(format!(
            "--stride {} must be between 1 and --ctx {}",
            cfg.stride, cfg.ctx
        )));
    }
    if cfg.batch_size == 0 {
        return Err(EvalError::Config("--batch-size must be at least 1".into()));
    }
    if cfg.chunks == Some(0) {
        return Err(EvalError::Config("--chunks must be at least 1".into()));
    }
    Ok(())
}

/// Runs one evaluation and returns its results.
pub fn evaluate(cfg: &EvalConfig, progress: ProgressMode, print_chunks: bool) -> Result<Results, EvalError> {
    let t_start = Instant::now();
    let gguf = GgufFile::open(&cfg.model)?;
    let mc = LlamaConfig::from_gguf(&gguf)?;
    check_config(cfg, &mc)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    if tok.vocab_size != mc.vocab_size {
        return Err(EvalError::Model(ModelError::Invalid {
            path: cfg.model.clone(),
            detail: format!(
                "the tokenizer has {} tokens but token_embd.weight has {} rows",
                tok.vocab_size, mc.vocab_size
            ),
        }));
    }

    let t_tok = Instant::now();
    let text = data::read_text(&cfg.data)?;
    let prepared = prepare(cfg, &tok, &text)?;
    let tokenize_s = t_tok.elapsed().as_secs_f64();
    let plan = prepared.plan;
    if plan.windows.is_empty() {
        return Err(EvalError::Data(DataError::Windows(format!(
            "{}: no window to score with these settings",
            cfg.data.display()
        ))));
    }
    tracing::info!(
        windows = plan.windows.len(),
        scored = plan.scored_tokens(),
        stream = plan.stream_tokens,
        "tokenized in {tokenize_s:.2} s"
    );

    let t_load = Instant::now();
    let model = Llama::from_gguf(&gguf, cfg.precision)?;
    let mut tensor_types = BTreeMap::new();
    for t in gguf.tensors.values() {
        *tensor_types.entry(gguf::ggml_type_name(t.type_id)).or_insert(0) += 1;
    }
    let file_bytes = gguf.bytes().len() as u64;
    drop(gguf);
    let load_s = t_load.elapsed().as_secs_f64();
    tracing::info!("model loaded in {load_s:.2} s ({} precision)", cfg.precision);

    let input_tokens: usize = plan.windows.iter().map(|w| w.input.len()).sum();
    let mut progress = Progress::new(progress, print_chunks, plan.windows.len(), input_tokens);
    let t_eval = Instant::now();
    let mut results = eval::score_windows(&model, &plan.windows, cfg.batch_size, |b| progress.update(b))?;
    let eval_s = t_eval.elapsed().as_secs_f64();
    progress.finish();
    results.sort_by_key(|r| r.index);

    let mut total = NllAccumulator::default();
    let mut groups: BTreeMap<usize, NllAccumulator> = BTreeMap::new();
    for r in &results {
        total.merge(&r.acc);
        groups.entry(r.group).or_default().merge(&r.acc);
    }
    let blocks: Vec<NllAccumulator> = groups.into_values().collect();
    let mean_nll = total.mean().unwrap_or(f64::NAN);
    let nll_sum = total.nll_sum();
    let (word_ppl, byte_ppl, bpb) = match prepared.documents {
        Some((_, words, bytes)) if words > 0 && bytes > 0 => (
            Some((nll_sum / words as f64).exp()),
            Some((nll_sum / bytes as f64).exp()),
            Some(nll_sum / bytes as f64 / std::f64::consts::LN_2),
        ),
        _ => (None, None, None),
    };

    let windows = plan
        .windows
        .iter()
        .zip(&results)
        .map(|(w, r)| WindowRecord {
            index: r.index,
            group: r.group,
            start: w.start,
            input_tokens: r.input_tokens,
            tokens: r.acc.count,
            nll_sum: r.acc.nll_sum(),
            nll_sum_fixed: r.acc.sum,
        })
        .collect();
    let model_sha = fingerprint::sha256_file(&cfg.model).map_err(|e| {
        EvalError::Config(format!("cannot read {} to fingerprint it: {e}", cfg.model.display()))
    })?;
    Ok(Results {
        schema_version: SCHEMA_VERSION,
        ppl_version: env!("CARGO_PKG_VERSION").to_string(),
        ppl: mean_nll.exp(),
        ppl_err: stats::ppl_error(&total),
        ci95: stats::bootstrap_ci95(&blocks, cfg.bootstrap_samples, cfg.seed),
        tokens: total.count,
        mean_nll,
        nll_sum,
        accumulator: total,
        word_perplexity: word_ppl,
        byte_perplexity: byte_ppl,
        bits_per_byte: bpb,
        config: serde_json::to_value(cfg).expect("config serializes"),
        model: ModelInfo {
            path: cfg.model.display().to_string(),
            sha256: model_sha,
            file_bytes,
            architecture: mc.architecture.clone(),
            parameters: mc.parameters(),
            vocab_size: mc.vocab_size,
            context_length: mc.context_length,
            layers: mc.n_layers,
            tensor_types,
            tokenizer: tok.kind.clone(),
            tokenizer_pre: tok.pre.clone(),
            add_bos: tok.add_bos,
        },
        data: DataInfo {
            path: cfg.data.display().to_string(),
            sha256: fingerprint::sha256_bytes(text.as_bytes()),
            bytes: text.len() as u64,
            stream_tokens: plan.stream_tokens as u64,
            documents: prepared.documents.map(|d| d.0),
            words: prepared.documents.map(|d| d.1),
        },
        windows,
        timings: Timings {
            load_s,
            tokenize_s,
            eval_s,
            total_s: t_start.elapsed().as_secs_f64(),
            tokens_per_s: input_tokens as f64 / eval_s,
            scored_tokens_per_s: total.count as f64 / eval_s,
        },
        system: SystemInfo {
            threads: cfg.threads,
            cpu_features: fingerprint::cpu_features().iter().map(|s| s.to_string()).collect(),
            peak_rss_bytes: fingerprint::peak_rss_bytes(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string()),
        },
    })
}
