//! `ppl compare`: a model against a base on the same tokens. Both models score every window
//! of the model's configuration; per scored token the two full distributions are compared in
//! f64 ([`crate::eval::kld`]), and the summary gives what llama.cpp's KL-divergence mode
//! gives (PPL of both with ±, their correlation, the PPL ratio and ΔPPL with paired
//! uncertainties, KLD and Δp statistics with percentiles, same-top-token rate) plus per-window
//! rows, without writing a logit file.
//!
//! The base defaults to `--base-precision f32`: the base file's weights dequantized to f32,
//! which for a quantized base is exactly its f32 export.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::comm::{local, CommError, Communicator};
use crate::eval::base_file::{self, BaseFileHeader};
use crate::eval::kld::{self, Summary, TokenComparison};
use crate::eval::ledger::Binding;
use crate::eval::{self, LOGIT_ROWS};
use crate::fingerprint;
use crate::model::{GgufFile, Llama, ModelError, Partition, Precision, Quantize};
use crate::parallel::schedule;
use crate::run::{
    first_error, join_rank, setup_rank, threads_per_rank, EvalConfig, EvalError, RankSetup,
};
use crate::tokenize::Tokenizer;

/// One side of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub path: String,
    pub sha256: String,
    pub precision: Precision,
    pub quantize: Option<Quantize>,
}

/// One window's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowComparison {
    pub index: usize,
    pub tokens: usize,
    pub ppl_base: f64,
    pub ppl_model: f64,
    pub kld_mean: f64,
    /// Percent of the window's tokens with the same top token.
    pub same_top: f64,
}

/// The base file this comparison wrote (`--save-base`) or read (`--base-logits`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseFileUse {
    pub path: String,
    /// `saved` (written by this run) or `read` (the base's logits recomputed from it, bit
    /// for bit).
    pub mode: String,
    pub bytes: u64,
    pub bytes_per_token: f64,
}

/// What `ppl compare --output` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareResults {
    pub ppl_version: String,
    pub base: Side,
    pub model: Side,
    #[serde(flatten)]
    pub summary: Summary,
    pub config: serde_json::Value,
    pub windows: Vec<WindowComparison>,
    /// Ranks that shared the windows (the result does not depend on it).
    pub ranks: usize,
    pub base_file: Option<BaseFileUse>,
    pub seconds: f64,
}

/// Where the base's distributions come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BaseSource {
    /// A GGUF model, run beside the compared one (`--base`, `--base-precision`).
    Model { path: PathBuf, precision: Precision },
    /// A file written earlier by `--save-base` (`--base-logits`), with the GGUF to take the
    /// base's output layer from (default: the path the file names).
    File {
        path: PathBuf,
        gguf: Option<PathBuf>,
    },
}

/// The comparison's own options.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareOptions {
    pub base: BaseSource,
    /// Also store the base's final hidden states here (`--save-base`).
    pub save_base: Option<PathBuf>,
}

/// The base, ready on a rank: the whole model, or its output layer and the stored rows.
struct LoadedBase {
    /// The whole base, or only its final norm and output layer (from a base file).
    llama: Llama,
    side: Side,
    file: Option<StoredRows>,
}

struct StoredRows {
    path: PathBuf,
    bytes: u64,
    /// Per window: its scored tokens' final hidden states, `hidden` f32 each.
    windows: Vec<Vec<f32>>,
}

/// Per-token comparisons of one window, and the base's rows when they are being saved.
struct WindowPart {
    index: usize,
    tokens: Vec<TokenComparison>,
    stored: Option<Vec<f32>>,
}

/// `ppl compare` on the local backend: `cfg.ranks` ranks as threads sharing one copy of each
/// model.
pub fn compare(cfg: &EvalConfig, opts: &CompareOptions) -> Result<CompareResults, EvalError> {
    let started = Instant::now();
    let cfg = &without_ledger(cfg);
    let n = cfg.ranks.max(1);
    let comms = local::world(n);
    let setups: Vec<Result<RankSetup, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = setup_rank(c, cfg, &cfg.data);
                    if let Err(e) = &r {
                        c.abort(&e.to_string());
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    let setups = first_error(setups)?;
    let (model, base) = load_models(cfg, &setups[0], opts)?;
    let per_rank = threads_per_rank(cfg.threads, n);
    let (model, base) = (&model, &base);
    let outcomes: Vec<Result<Option<CompareResults>, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&setups)
            .map(|(c, setup)| {
                s.spawn(move || {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(per_rank)
                        .build()
                        .map_err(|e| EvalError::Threads(e.to_string()))?;
                    let r =
                        pool.install(|| compare_on_rank(c, cfg, setup, model, base, opts, started));
                    if let Err(e) = &r {
                        c.abort(&e.to_string());
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    first_error(outcomes)?
        .swap_remove(0)
        .ok_or_else(|| EvalError::Config("rank 0 returned no comparison".into()))
}

/// `ppl compare` on one rank of any backend (one MPI process each): every rank loads both
/// sides; rank 0 returns the results.
pub fn compare_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    opts: &CompareOptions,
) -> Result<Option<CompareResults>, EvalError> {
    let started = Instant::now();
    let cfg = &without_ledger(cfg);
    let setup = setup_rank(comm, cfg, &cfg.data)?;
    let loaded = load_models(cfg, &setup, opts);
    // Every rank learns whether every rank loaded, so none waits for a failed one.
    let mine = loaded
        .as_ref()
        .map_or_else(|e| format!("{}\n{e}", comm.host()), |_| String::new());
    for (rank, msg) in comm.all_gather(mine.into_bytes())?.iter().enumerate() {
        if !msg.is_empty() && loaded.is_ok() {
            let msg = String::from_utf8_lossy(msg);
            let (host, reason) = msg.split_once('\n').unwrap_or(("unknown host", &msg));
            return Err(EvalError::Comm(CommError::RankFailed {
                rank,
                host: host.to_string(),
                reason: reason.to_string(),
            }));
        }
    }
    let (model, base) = loaded?;
    compare_on_rank(comm, cfg, &setup, &model, &base, opts, started)
}

/// The comparison writes nothing but its results: no ledger, no run directory.
fn without_ledger(cfg: &EvalConfig) -> EvalConfig {
    EvalConfig {
        run_dir: Some(std::env::temp_dir()),
        resume: false,
        ..cfg.clone()
    }
}

/// What a base file must agree with: the base model, the data, the tokenizer and the plan.
fn plan_binding(cfg: &EvalConfig, setup: &RankSetup, base_sha256: &str) -> Binding {
    Binding {
        model_sha256: base_sha256.to_string(),
        data_sha256: setup.text_sha256.clone(),
        tokenizer_sha256: setup.tok.fingerprint.clone(),
        config: serde_json::json!({
            "method": cfg.method,
            "ctx": cfg.ctx,
            "stride": cfg.stride,
            "chunks": cfg.chunks,
            "max_tokens": cfg.max_tokens,
        })
        .to_string(),
        windows: setup.prepared.plan.windows.len(),
    }
}

fn sha256(p: &Path) -> Result<String, EvalError> {
    fingerprint::sha256_file_cached(p).map_err(|source| EvalError::Io {
        action: "read",
        path: p.to_path_buf(),
        purpose: "",
        source,
        hint: "",
    })
}

/// Loads the compared model and the base (a model or a base file), checking they fit.
fn load_models(
    cfg: &EvalConfig,
    setup: &RankSetup,
    opts: &CompareOptions,
) -> Result<(Llama, LoadedBase), EvalError> {
    if !cfg.device.is_cpu() {
        return Err(EvalError::Config(format!(
            "ppl compare runs on the CPU only so far (--device {}): drop --device, or evaluate each model with `ppl eval --device {}` and compare their results.json",
            cfg.device, cfg.device
        )));
    }
    let cpu = &candle_core::Device::Cpu;
    let vocab = setup.mc.vocab_size;
    let (path, precision, file) = match &opts.base {
        BaseSource::Model { path, precision } => (path.clone(), *precision, None),
        BaseSource::File { path, gguf } => {
            let (header, windows) = base_file::read(path)?;
            let now = plan_binding(cfg, setup, &header.binding.model_sha256);
            let differs = header.binding.differences(&now);
            if !differs.is_empty() {
                return Err(EvalError::Config(format!(
                    "{} (--base-logits) was saved for another evaluation: {}; use the data and options it was saved with, or save it again with --save-base",
                    path.display(),
                    differs.join("; ").replace("ledger ", "file ")
                )));
            }
            let gguf = gguf
                .clone()
                .unwrap_or_else(|| PathBuf::from(&header.base_path));
            let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
            let stored = StoredRows {
                path: path.clone(),
                bytes,
                windows,
            };
            (gguf, header.base_precision, Some((header, stored)))
        }
    };
    if !path.exists() {
        return Err(EvalError::Config(format!(
            "cannot open the base model {} (--base): no such file; give the GGUF (or checkpoint directory) the model is compared with",
            path.display()
        )));
    }
    let gguf = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    // Different tokenizer files (a GGUF against a Hugging Face checkpoint of the same model)
    // are fine when they cut this data into the same windows of the same ids.
    let same_windows = || -> Result<bool, EvalError> {
        if tok.vocab_size != setup.tok.vocab_size {
            return Ok(false);
        }
        let loaded = crate::data::load(&cfg.data, &cfg.text_field)?;
        let theirs = crate::run::prepare(cfg, &tok, &loaded)?.plan;
        let ours = &setup.prepared.plan;
        Ok(theirs.windows.len() == ours.windows.len()
            && theirs
                .windows
                .iter()
                .zip(&ours.windows)
                .all(|(a, b)| a.input == b.input && a.targets == b.targets))
    };
    if tok.fingerprint != setup.tok.fingerprint && !same_windows()? {
        return Err(EvalError::Config(format!(
            "{} and {} have different tokenizers ({} vs {} tokens; they cut this data into different ids): the comparison needs the same tokens; compare models of one family",
            path.display(),
            cfg.model.display(),
            tok.vocab_size,
            setup.tok.vocab_size
        )));
    }
    let side = Side {
        path: path.display().to_string(),
        sha256: sha256(&path)?,
        precision,
        quantize: None,
    };
    let base_config = crate::model::LlamaConfig::from_gguf(&gguf)?;
    let n_layers = base_config.n_layers;
    let part = match &file {
        // Only the final norm and the output layer.
        Some(_) => Partition {
            layers: n_layers..n_layers,
            embed: false,
            ..Partition::full(n_layers)
        },
        None => Partition::full(n_layers),
    };
    let file = match file {
        Some((header, stored)) => {
            if header.binding.model_sha256 != side.sha256 {
                return Err(EvalError::Config(format!(
                    "{} was saved from a base with sha256 {}, but {} has {}: give the base it was saved from with --base",
                    stored.path.display(),
                    header.binding.model_sha256,
                    path.display(),
                    side.sha256
                )));
            }
            if header.hidden != base_config.hidden_size {
                return Err(EvalError::Config(format!(
                    "{} stores rows of {} values but {} has a hidden size of {}",
                    stored.path.display(),
                    header.hidden,
                    path.display(),
                    base_config.hidden_size
                )));
            }
            Some(stored)
        }
        None => None,
    };
    let llama = Llama::load(&gguf, precision, &part, None, cpu)?;
    if llama.config.vocab_size != vocab {
        return Err(EvalError::Config(format!(
            "{} has a vocabulary of {} rows, {} of {vocab}",
            path.display(),
            llama.config.vocab_size,
            cfg.model.display(),
        )));
    }
    let base = LoadedBase { llama, side, file };
    let model = Llama::load(
        &setup.gguf,
        cfg.precision,
        &Partition::full(setup.mc.n_layers),
        cfg.quantize,
        cpu,
    )?;
    Ok((model, base))
}

/// This rank's share of the windows (static: every size-th), compared token by token; rank 0
/// gathers every rank's windows and summarises them in window order.
fn compare_on_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    setup: &RankSetup,
    model: &Llama,
    base: &LoadedBase,
    opts: &CompareOptions,
    started: Instant,
) -> Result<Option<CompareResults>, EvalError> {
    let windows = &setup.prepared.plan.windows;
    let all: Vec<usize> = (0..windows.len()).collect();
    let share = schedule::static_share(&all, comm.rank(), comm.size());
    let save = opts.save_base.is_some();
    if save && base.file.is_some() {
        return Err(EvalError::Config(
            "--save-base needs the base model (--base), not --base-logits".into(),
        ));
    }
    let vocab = model.config.vocab_size;
    let hidden = base.llama.config.hidden_size;
    let mut parts: Vec<WindowPart> = Vec::with_capacity(share.len());
    let mut last_report = Instant::now();
    for unit in schedule::units(windows, &share, cfg.batch_size) {
        let batch: Vec<_> = unit.iter().map(|&i| windows[i].clone()).collect();
        let ids = eval::batch_ids(&batch, model.device())?;
        let (rows_m, targets) = eval::scored_rows(&model.hidden_states(&ids)?, &batch)?;
        // The base's final hidden states at the scored positions: computed, or stored.
        let rows_b = match &base.file {
            None => eval::scored_rows(&base.llama.hidden_states(&ids)?, &batch)?
                .0
                .to_dtype(candle_core::DType::F32)
                .map_err(ModelError::from)?,
            Some(f) => {
                let rows: Vec<f32> = unit
                    .iter()
                    .flat_map(|&i| f.windows[i].iter().copied())
                    .collect();
                if rows.len() != targets.len() * hidden {
                    return Err(EvalError::Config(format!(
                        "{} holds {} rows for windows {unit:?} but this plan scores {} tokens there; save it again with --save-base",
                        f.path.display(),
                        rows.len() / hidden,
                        targets.len()
                    )));
                }
                candle_core::Tensor::from_vec(
                    rows,
                    (targets.len(), hidden),
                    &candle_core::Device::Cpu,
                )
                .map_err(ModelError::from)?
            }
        };
        let mut tokens = Vec::with_capacity(targets.len());
        let mut r = 0;
        while r < targets.len() {
            let n = LOGIT_ROWS.min(targets.len() - r);
            let logits = |m: &Llama, rows: &candle_core::Tensor| -> Result<Vec<f32>, ModelError> {
                Ok(m.logits(&rows.narrow(0, r, n)?)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            };
            let lm = logits(model, &rows_m)?;
            let lb = logits(&base.llama, &rows_b)?;
            tokens.extend(kld::compare_rows(&lb, &lm, vocab, &targets[r..r + n]));
            r += n;
        }
        let stored = if save {
            rows_b
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(ModelError::from)?
        } else {
            Vec::new()
        };
        let mut k = 0;
        for (w, &index) in batch.iter().zip(&unit) {
            let len = w.targets.len();
            parts.push(WindowPart {
                index,
                tokens: tokens[k..k + len].to_vec(),
                stored: save.then(|| stored[k * hidden..(k + len) * hidden].to_vec()),
            });
            k += len;
        }
        if comm.rank() == 0 && last_report.elapsed().as_secs() >= 10 {
            tracing::info!(
                "rank 0 compared {} of its {} windows",
                parts.len(),
                share.len()
            );
            last_report = Instant::now();
        }
    }
    let Some(gathered) = comm.gather(0, encode_parts(&parts))? else {
        return Ok(None);
    };
    let mut by_window: Vec<Option<WindowPart>> = (0..windows.len()).map(|_| None).collect();
    for (rank, bytes) in gathered.iter().enumerate() {
        let decoded = decode_parts(bytes).ok_or_else(|| CommError::Protocol {
            from: rank,
            detail: "malformed comparison parts".into(),
        })?;
        for p in decoded {
            let i = p.index;
            match by_window.get_mut(i) {
                Some(slot @ None) => *slot = Some(p),
                _ => {
                    return Err(EvalError::Comm(CommError::Protocol {
                        from: rank,
                        detail: format!("window {i} sent twice or out of range"),
                    }))
                }
            }
        }
    }
    let parts: Vec<WindowPart> = by_window
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            p.ok_or_else(|| EvalError::Config(format!("window {i} was compared by no rank")))
        })
        .collect::<Result<_, _>>()?;
    finish(cfg, setup, base, opts, parts, comm.size(), started).map(Some)
}

/// Rank 0: the summary, the per-window rows and the base file.
fn finish(
    cfg: &EvalConfig,
    setup: &RankSetup,
    base: &LoadedBase,
    opts: &CompareOptions,
    parts: Vec<WindowPart>,
    ranks: usize,
    started: Instant,
) -> Result<CompareResults, EvalError> {
    let all_tokens: Vec<TokenComparison> = parts
        .iter()
        .flat_map(|p| p.tokens.iter().copied())
        .collect();
    if all_tokens.is_empty() {
        return Err(EvalError::Config("no scored token to compare".into()));
    }
    let window_rows = parts
        .iter()
        .map(|p| {
            let t = &p.tokens;
            let n = t.len().max(1) as f64;
            WindowComparison {
                index: p.index,
                tokens: t.len(),
                ppl_base: (t.iter().map(|x| x.nll_base).sum::<f64>() / n).exp(),
                ppl_model: (t.iter().map(|x| x.nll_model).sum::<f64>() / n).exp(),
                kld_mean: t.iter().map(|x| x.kld).sum::<f64>() / n,
                same_top: 100.0 * t.iter().filter(|x| x.same_top).count() as f64 / n,
            }
        })
        .collect();
    let file_use = |path: &Path, mode: &str, bytes: u64| BaseFileUse {
        path: path.display().to_string(),
        mode: mode.to_string(),
        bytes,
        bytes_per_token: bytes as f64 / all_tokens.len() as f64,
    };
    let base_file = match (&base.file, &opts.save_base) {
        (Some(f), _) => Some(file_use(&f.path, "read", f.bytes)),
        (None, Some(path)) => {
            let header = BaseFileHeader {
                version: base_file::VERSION,
                base_path: base.side.path.clone(),
                base_precision: base.side.precision,
                binding: plan_binding(cfg, setup, &base.side.sha256),
                hidden: base.llama.config.hidden_size,
                tokens: all_tokens.len(),
            };
            let windows: Vec<Vec<f32>> = parts
                .iter()
                .map(|p| p.stored.clone().unwrap_or_default())
                .collect();
            base_file::write(path, &header, &windows)?;
            let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
            Some(file_use(path, "saved", bytes))
        }
        (None, None) => None,
    };
    let base_side = base.side.clone();
    Ok(CompareResults {
        ppl_version: env!("CARGO_PKG_VERSION").to_string(),
        base: base_side,
        model: Side {
            path: cfg.model.display().to_string(),
            sha256: sha256(&cfg.model)?,
            precision: cfg.precision,
            quantize: cfg.quantize,
        },
        summary: kld::summarize(&all_tokens),
        config: serde_json::to_value(cfg).expect("config serializes"),
        windows: window_rows,
        ranks,
        base_file,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A rank's windows as bytes: per window its index, token count, the comparisons (four f64
/// and a flag each) and, when saving, the stored base tokens.
fn encode_parts(parts: &[WindowPart]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.index as u64).to_le_bytes());
        out.extend_from_slice(&(p.tokens.len() as u64).to_le_bytes());
        for t in &p.tokens {
            for v in [t.nll_base, t.nll_model, t.kld, t.delta_p] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(t.same_top as u8);
        }
        match &p.stored {
            Some(s) => {
                out.push(1);
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend(s.iter().flat_map(|v| v.to_le_bytes()));
            }
            None => out.push(0),
        }
    }
    out
}

fn decode_parts(mut b: &[u8]) -> Option<Vec<WindowPart>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let mut out = Vec::new();
    while !b.is_empty() {
        let index = u64_of(take(&mut b, 8)?) as usize;
        let count = u64_of(take(&mut b, 8)?) as usize;
        let mut tokens = Vec::with_capacity(count.min(1 << 20));
        for _ in 0..count {
            let f = take(&mut b, 33)?;
            let v = |i: usize| f64::from_bits(u64_of(&f[8 * i..8 * i + 8]));
            tokens.push(TokenComparison {
                nll_base: v(0),
                nll_model: v(1),
                kld: v(2),
                delta_p: v(3),
                same_top: f[32] == 1,
            });
        }
        let stored = match take(&mut b, 1)?[0] {
            0 => None,
            1 => {
                let len = u64_of(take(&mut b, 8)?) as usize;
                let bytes = take(&mut b, len.checked_mul(4)?)?;
                Some(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                )
            }
            _ => return None,
        };
        out.push(WindowPart {
            index,
            tokens,
            stored,
        });
    }
    Some(out)
}

/// The summary as llama.cpp prints it.
pub fn render_text(r: &CompareResults) -> String {
    let s = &r.summary;
    let pct = |p: &kld::Percentiles, scale: f64, unit: &str, name: &str| -> String {
        [
            ("Maximum", p.max),
            ("99.9%  ", p.p99_9),
            ("99.0%  ", p.p99),
            ("95.0%  ", p.p95),
            ("90.0%  ", p.p90),
            ("Median ", p.median),
            ("10.0%  ", p.p10),
            (" 5.0%  ", p.p5),
            (" 1.0%  ", p.p1),
            (" 0.1%  ", p.p0_1),
            ("Minimum", p.min),
        ]
        .iter()
        .map(|(label, v)| format!("{label} {name}: {:>10.6}{unit}\n", v * scale))
        .collect()
    };
    let mut out = format!(
        "base:  {} ({})\nmodel: {} ({}{})\n{} tokens\n\n====== Perplexity statistics ======\n",
        r.base.path,
        r.base.precision,
        r.model.path,
        r.model.precision,
        r.model
            .quantize
            .map(|q| format!(", quantized at load to {} g{}", q.scheme, q.group_size))
            .unwrap_or_default(),
        s.tokens
    );
    out += &format!(
        "Mean PPL(Q)                   : {:>10.6} ± {:.6}\n",
        s.ppl_model, s.ppl_model_err
    );
    out += &format!(
        "Mean PPL(base)                : {:>10.6} ± {:.6}\n",
        s.ppl_base, s.ppl_base_err
    );
    out += &format!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:>9.2}%\n",
        100.0 * s.cor_ln_ppl
    );
    out += &format!(
        "Mean ln(PPL(Q)/PPL(base))     : {:>10.6} ± {:.6}\n",
        s.mean_ln_ratio.value, s.mean_ln_ratio.err
    );
    out += &format!(
        "Mean PPL(Q)/PPL(base)         : {:>10.6} ± {:.6}\n",
        s.ppl_ratio.value, s.ppl_ratio.err
    );
    out += &format!(
        "Mean PPL(Q)-PPL(base)         : {:>10.6} ± {:.6}\n\n====== KL divergence statistics ======\n",
        s.delta_ppl, s.delta_ppl_err
    );
    out += &format!(
        "Mean    KLD: {:>10.6} ± {:.6}\n",
        s.kld_mean, s.kld_mean_err
    );
    out += &pct(&s.kld_percentiles, 1.0, "", "KLD");
    if let Some(f) = &r.base_file {
        out += &format!(
            "Base file {} ({}): {:.1} MB, {:.0} bytes per token (the base's final hidden states; its logits are recomputed exactly)\n",
            f.path,
            f.mode,
            f.bytes as f64 / 1e6,
            f.bytes_per_token
        );
    }
    out += "\n====== Token probability statistics ======\n";
    out += &format!(
        "Mean    Δp: {:>9.3} ± {:.3} %\n",
        100.0 * s.delta_p_mean.value,
        100.0 * s.delta_p_mean.err
    );
    out += &pct(&s.delta_p_percentiles, 100.0, " %", "Δp");
    out += &format!("RMS Δp    : {:>9.3} %\n", 100.0 * s.delta_p_rms);
    out += &format!(
        "Same top p: {:>9.3} ± {:.3} %\n",
        s.same_top, s.same_top_err
    );
    out
}
