//! `ppl compare`: a model against a base on the same tokens. Both models score every window
//! of the model's configuration; per scored token the two full distributions are compared in
//! f64 ([`crate::eval::kld`]), and the summary gives what llama.cpp's KL-divergence mode
//! gives (PPL of both with ±, their correlation, the PPL ratio and ΔPPL with paired
//! uncertainties, KLD and Δp statistics with percentiles, same-top-token rate) plus per-window
//! rows, without writing a logit file.
//!
//! The base defaults to `--base-precision f32`: the base file's weights dequantized to f32,
//! which for a quantized base is exactly its f32 export.

//!
//! Compare runs on the data-parallel protocol as a [`scorer::CompareScorer`]: windows are
//! shared out under `--schedule` (static or dynamic), each window's comparison travels to
//! rank 0 as a [`WindowPart`], and rank 0 summarises them in window order, so no figure
//! depends on the world size, the schedule or the batch size. A local world runs its ranks
//! through the same driver as `ppl eval` (a panicking rank is named and ends the run).
//!
//! Like `ppl eval`, a comparison keeps a ledger of its finished windows in its run directory
//! (the token comparisons, bound to both models, the data and the scoring options, never the
//! stored rows), with `config.yaml` and the base ([`SAVED_BASE`]) beside it:
//! `ppl compare --resume DIR` compares only the windows missing there, on any number of ranks,
//! and its figures are bit-identical to an uninterrupted run's.
//!
//! - [`load`]: both sides on a rank, and every refusal before scoring;
//! - [`scorer`]: a unit of windows through both models; [`record`]: its wire form;
//! - the results schema and its text rendering live in [`crate::report::comparison`] and
//!   [`crate::report::comparison_text`].

mod load;
pub mod record;
mod scorer;

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::comm::{local, CommError, Communicator};
use crate::eval::base_file::{self, BaseFileHeader};
use crate::eval::kld::{self, TokenComparison};
use crate::eval::ledger::{Binding, LedgerWriter};
use crate::fingerprint;
use crate::model::{Llama, Precision};
use crate::parallel::data_parallel::{self as dp, Gathered};
pub use crate::report::comparison::{BaseFileUse, CompareResults, Side, WindowComparison};
use crate::report::RunInfo;
use crate::run::resume::{self, ResumePlan};
use crate::run::{
    abort_on_error, on_every_rank, setup_rank, threads_per_rank, EvalConfig, EvalError, RankSetup,
    RankThreads, RunOptions,
};
use load::{load_models, LoadedBase};
pub use record::WindowPart;
use scorer::CompareScorer;

/// The file in a comparison's run directory that names its base, so that
/// `ppl compare --resume DIR` alone finds it again (a [`BaseSource`] as JSON).
pub const SAVED_BASE: &str = "compare-base.json";

/// Where the base's distributions come from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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

impl BaseSource {
    /// The same base with absolute paths (saved in the run directory, where relative paths
    /// would resolve against the wrong place).
    pub fn absolute(&self) -> BaseSource {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        match self {
            BaseSource::Model { path, precision } => BaseSource::Model {
                path: abs(path),
                precision: *precision,
            },
            BaseSource::File { path, gguf } => BaseSource::File {
                path: abs(path),
                gguf: gguf.as_ref().map(abs),
            },
        }
    }
}

/// The comparison's own options.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    pub base: BaseSource,
    /// Also store the base's final hidden states here (`--save-base`).
    pub save_base: Option<PathBuf>,
    /// The run directory's files and messages, as for `ppl eval`.
    pub run: RunOptions,
}

/// `ppl compare` on the local backend: `cfg.ranks` ranks as threads sharing one copy of each
/// model.
pub fn compare(cfg: &EvalConfig, opts: &CompareOptions) -> Result<CompareResults, EvalError> {
    let started = Instant::now();
    let n = cfg.ranks.max(1);
    let comms = local::world(n);
    let setup_threads = RankThreads {
        pool_threads: None,
        panic_hint: "",
    };
    let setups = on_every_rank(&comms, &setup_threads, |c| setup_rank(c, cfg, &cfg.data))?;
    let (model, base) = load_models(cfg, &setups[0], opts)?;
    let per_rank = threads_per_rank(cfg.threads, n);
    let scoring_threads = RankThreads {
        pool_threads: Some(per_rank),
        panic_hint: "; the ledger in the run directory keeps every window finished before it (resume with `ppl compare --resume DIR`)",
    };
    let mut outcomes = on_every_rank(&comms, &scoring_threads, |c| {
        let job = RankJob {
            cfg,
            setup: &setups[c.rank()],
            model: &model,
            base: &base,
            opts,
            started,
            threads: per_rank,
        };
        compare_on_rank(c, &job)
    })?;
    outcomes
        .swap_remove(0)
        .ok_or_else(|| EvalError::Internal("rank 0 returned no comparison".into()))
}

/// `ppl compare` on one rank of any backend (one MPI process each): every rank loads both
/// sides; rank 0 returns the results.
pub fn compare_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    opts: &CompareOptions,
) -> Result<Option<CompareResults>, EvalError> {
    let started = Instant::now();
    let setup = abort_on_error(comm, setup_rank(comm, cfg, &cfg.data))?;
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
    let job = RankJob {
        cfg,
        setup: &setup,
        model: &model,
        base: &base,
        opts,
        started,
        threads: cfg.threads,
    };
    compare_on_rank(comm, &job)
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
        base: None,
    }
}

/// What the ledger's records are valid for: the compared model, the data, the tokenizer, the
/// options a window's values depend on (as for `ppl eval`) and the base (its fingerprint and
/// precision: whether it runs whole or from a base file changes no bit).
fn ledger_binding(
    comm: &dyn Communicator,
    job: &RankJob<'_>,
    model_sha256: String,
) -> Result<Binding, EvalError> {
    let (cfg, setup, side) = (job.cfg, job.setup, &job.base.side);
    Ok(Binding {
        model_sha256,
        data_sha256: setup.text_sha256.clone(),
        tokenizer_sha256: setup.tok.fingerprint.clone(),
        config: cfg.values_json(&cfg.dims(comm.size())?),
        windows: setup.prepared.plan.windows.len(),
        base: Some(format!(
            "sha256 {}, precision {}",
            side.sha256, side.precision
        )),
    })
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

/// What one rank compares with.
struct RankJob<'a> {
    cfg: &'a EvalConfig,
    setup: &'a RankSetup,
    model: &'a Llama,
    base: &'a LoadedBase,
    opts: &'a CompareOptions,
    started: Instant,
    /// Compute threads of this rank.
    threads: usize,
}

/// This rank's share of the windows under `--schedule`, compared token by token; rank 0
/// gathers every rank's windows and summarises them in window order.
fn compare_on_rank(
    comm: &dyn Communicator,
    job: &RankJob<'_>,
) -> Result<Option<CompareResults>, EvalError> {
    let windows = &job.setup.prepared.plan.windows;
    let model_sha256 = sha256(&job.cfg.model)?;
    let binding = ledger_binding(comm, job, model_sha256.clone())?;
    let (resume_plan, done, notes) =
        resume::agree::<WindowPart>(comm, job.cfg, job.setup, &binding, &job.opts.run)?;
    let mut ledger = LedgerWriter::create(
        &resume_plan.run_dir,
        comm.rank(),
        resume_plan.attempt,
        binding,
    )
    .map_err(|e| {
        comm.abort(&e.to_string());
        EvalError::from(e)
    })?;
    let mut scorer = CompareScorer {
        model: job.model,
        base: job.base,
        windows,
        save: job.opts.save_base.is_some(),
    };
    let work = dp::Work {
        windows,
        todo: (0..windows.len())
            .filter(|i| !resume_plan.done.contains(i))
            .collect(),
        done,
        batch_size: job.cfg.batch_size,
        schedule: job.cfg.schedule,
        threads: job.threads,
    };
    let (mut compared, mut last_report) = (0, Instant::now());
    let on_results = |parts: &[WindowPart]| {
        compared += parts.len();
        if last_report.elapsed().as_secs() >= 10 {
            tracing::info!("compared {compared} of {} windows", windows.len());
            last_report = Instant::now();
        }
    };
    let Some(gathered) = dp::run(comm, &mut scorer, work, Some(&mut ledger), on_results)? else {
        return Ok(None);
    };
    let run = run_info(job.cfg, &resume_plan, notes);
    let ranks = comm.size();
    finish(
        job,
        gathered,
        Finished {
            ranks,
            run,
            model_sha256,
        },
    )
    .map(Some)
}

/// The run directory as `results.json` of `ppl eval` reports it.
fn run_info(cfg: &EvalConfig, plan: &ResumePlan, notes: Vec<String>) -> RunInfo {
    RunInfo {
        dir: plan.run_dir.display().to_string(),
        attempt: plan.attempt,
        resumed: cfg.resume,
        windows_from_ledger: plan.done.len(),
        ledger_notes: notes,
    }
}

/// What the scoring leaves to [`finish`] besides the windows.
struct Finished {
    ranks: usize,
    run: RunInfo,
    model_sha256: String,
}

/// Rank 0: the summary, the per-window rows and the base file.
fn finish(
    job: &RankJob<'_>,
    gathered: Gathered<WindowPart>,
    done: Finished,
) -> Result<CompareResults, EvalError> {
    let (cfg, setup, base, opts) = (job.cfg, job.setup, job.base, job.opts);
    let parts = gathered.results;
    let all_tokens: Vec<TokenComparison> = parts
        .iter()
        .flat_map(|p| p.tokens.iter().copied())
        .collect();
    if all_tokens.is_empty() {
        return Err(EvalError::Internal("no scored token to compare".into()));
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
            sha256: done.model_sha256,
            precision: cfg.precision,
            quantize: cfg.quantize,
        },
        summary: kld::summarize(&all_tokens),
        config: serde_json::to_value(cfg).expect("config serializes"),
        windows: window_rows,
        ranks: done.ranks,
        rank_stats: gathered.ranks,
        run: Some(done.run),
        base_file,
        seconds: job.started.elapsed().as_secs_f64(),
    })
}
