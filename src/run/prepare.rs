//! Phase one on every rank: read the model header and tokenizer, read the text, agree with the
//! other ranks on what is being evaluated, tokenize and cut windows ([`setup_rank`]). Fails (on
//! every rank alike, for disagreements) before any weight is loaded.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::checks::{check_config, check_plan};
use super::config::EvalConfig;
use super::error::EvalError;
use crate::comm::agreement::{self, Fingerprints};
use crate::comm::{CommError, Communicator};
use crate::data::{self, windows, DataError, Method, WindowPlan};
use crate::fingerprint;
use crate::model::{GgufFile, LlamaConfig, ModelError};
use crate::tokenize::Tokenizer;

/// What the text became before any weight is loaded.
pub(crate) struct Prepared {
    pub(crate) plan: WindowPlan,
    pub(crate) documents: Option<(u64, u64, u64)>,
}

pub(crate) fn prepare(
    cfg: &EvalConfig,
    tok: &Tokenizer,
    data: &data::Data,
) -> Result<Prepared, EvalError> {
    let text = data.text.as_str();
    let too_short = |n: usize, need: usize| {
        EvalError::Data(DataError::Windows(format!(
            "{}: the text has {n} tokens, fewer than the {need} one window needs with --ctx {}; use a smaller --ctx or a longer text",
            cfg.data.display(),
            cfg.ctx
        )))
    };
    match cfg.method {
        Method::Chunks | Method::Stride | Method::Disjoint => {
            let prefix = tok.encode_at_least(text, tokens_needed(cfg))?;
            let mut tokens = prefix.ids;
            let whole_text = prefix.whole;
            if let Some(m) = cfg.max_tokens {
                tokens.truncate(m);
            }
            let ws = if cfg.method != Method::Stride {
                if tokens.len() < cfg.ctx {
                    return Err(too_short(tokens.len(), cfg.ctx));
                }
                if cfg.method == Method::Disjoint {
                    windows::disjoint(&tokens, cfg.ctx, cfg.chunks)
                } else {
                    let bos = if tok.add_bos { tok.bos_id } else { None };
                    windows::chunks(&tokens, cfg.ctx, cfg.chunks, bos)
                }
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
                    whole_text,
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
            let docs = crate::task::prepare_documents(
                cfg.task.map(|t| t.name),
                data,
                tok,
                prefix,
                cfg.chunks,
            )?;
            let (mut ws, mut stream, mut words, mut bytes) = (Vec::new(), 0, 0, 0);
            for (d, doc) in docs.iter().enumerate() {
                stream += doc.ids.len();
                words += doc.words;
                bytes += doc.bytes;
                let first = ws.len();
                ws.extend(windows::rolling(&doc.ids, cfg.ctx, prefix, d, first));
            }
            Ok(Prepared {
                plan: WindowPlan {
                    windows: ws,
                    stream_tokens: stream,
                    whole_text: true,
                },
                documents: Some((docs.len() as u64, words, bytes)),
            })
        }
    }
}

/// How many tokens of the stream the windows of `chunks`/`stride` can read: with `--chunks N`
/// or `--max-tokens M` only a prefix of a long text matters, and the rest is not tokenized.
/// Any longer prefix gives the same windows: `chunks` reads `N × ctx` tokens, `stride`'s first
/// `N` windows end by `(N - 1) × stride + ctx` (one more keeps the last of them from being
/// the stream's end).
fn tokens_needed(cfg: &EvalConfig) -> usize {
    let by_windows = cfg.chunks.map(|n| match cfg.method {
        Method::Stride => n
            .saturating_sub(1)
            .saturating_mul(cfg.stride)
            .saturating_add(cfg.ctx)
            .saturating_add(1),
        _ => n.saturating_mul(cfg.ctx),
    });
    by_windows
        .into_iter()
        .chain(cfg.max_tokens)
        .min()
        .unwrap_or(usize::MAX)
}

/// Everything a rank knows before the weights are loaded.
pub struct RankSetup {
    pub(crate) gguf: GgufFile,
    pub(crate) mc: LlamaConfig,
    pub(crate) tok: Tokenizer,
    pub(crate) data_path: PathBuf,
    pub(crate) text_sha256: String,
    pub(crate) text_len: u64,
    pub(crate) prepared: Prepared,
    pub(crate) tokenize_s: f64,
    pub(crate) seed: u64,
    pub(crate) started: Instant,
}

/// What this rank is about to evaluate, for the start-up agreement.
pub(crate) fn make_fingerprints(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    data_path: &Path,
    tok: &Tokenizer,
    data_sha256: &str,
) -> Result<Fingerprints, EvalError> {
    let model_sha256 =
        fingerprint::sha256_file_cached(&cfg.model).map_err(|source| EvalError::Io {
            action: "read",
            path: cfg.model.clone(),
            purpose: " to fingerprint it",
            source,
            hint: "",
        })?;
    let scoring = cfg.scoring_json();
    Ok(Fingerprints {
        rank: comm.rank(),
        host: comm.host(),
        model_path: cfg.model.display().to_string(),
        model_sha256,
        data_path: data_path.display().to_string(),
        data_sha256: data_sha256.to_string(),
        tokenizer_sha256: tok.fingerprint.clone(),
        config_sha256: fingerprint::sha256_bytes(scoring.as_bytes()),
        config: scoring,
    })
}

/// This rank's fingerprints, reading the model header and the data (`ppl validate`).
pub fn fingerprints(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    data_path: &Path,
) -> Result<Fingerprints, EvalError> {
    let gguf = GgufFile::open(&cfg.model)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    let loaded = data::load(data_path, &cfg.text_field)?;
    make_fingerprints(
        comm,
        cfg,
        data_path,
        &tok,
        &fingerprint::sha256_bytes(loaded.text.as_bytes()),
    )
}

/// Phase one on every rank: checks, fingerprints, agreement, tokenization. Fails (on every
/// rank alike, for disagreements) before any weight is loaded.
pub fn setup_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    data_path: &Path,
) -> Result<RankSetup, EvalError> {
    let started = Instant::now();
    let gguf = GgufFile::open(&cfg.model)?;
    let mc = LlamaConfig::from_gguf(&gguf)?;
    check_config(cfg, &mc)?;
    let dims = cfg.dims(comm.size())?;
    check_plan(cfg, &dims, &gguf, &mc)?;
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
    let loaded = data::load(data_path, &cfg.text_field)?;
    let text_sha256 = fingerprint::sha256_bytes(loaded.text.as_bytes());
    let mine = make_fingerprints(comm, cfg, data_path, &tok, &text_sha256)?;
    agreement::check(comm, &mine)?;
    let seed_bytes = comm.broadcast(0, cfg.seed.to_le_bytes().to_vec())?;
    let seed =
        u64::from_le_bytes(
            seed_bytes
                .as_slice()
                .try_into()
                .map_err(|_| CommError::Protocol {
                    from: 0,
                    detail: "seed broadcast of the wrong size".into(),
                })?,
        );

    let t_tok = Instant::now();
    let cfg_here = EvalConfig {
        data: data_path.to_path_buf(),
        ..cfg.clone()
    };
    let prepared = prepare(&cfg_here, &tok, &loaded)?;
    let tokenize_s = t_tok.elapsed().as_secs_f64();
    if prepared.plan.windows.is_empty() {
        return Err(EvalError::Data(DataError::Windows(format!(
            "{}: no window to score with these settings",
            data_path.display()
        ))));
    }
    tracing::info!(
        rank = comm.rank(),
        windows = prepared.plan.windows.len(),
        scored = prepared.plan.scored_tokens(),
        stream = prepared.plan.stream_tokens,
        "tokenized in {tokenize_s:.2} s"
    );
    Ok(RankSetup {
        gguf,
        mc,
        tok,
        data_path: data_path.to_path_buf(),
        text_sha256,
        text_len: loaded.text.len() as u64,
        prepared,
        tokenize_s,
        seed,
        started,
    })
}
