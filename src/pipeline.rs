//! The evaluation pipeline, end to end, on every rank: read the model header and tokenizer,
//! read the text, agree with the other ranks on what is being evaluated, tokenize and cut
//! windows, load the weights, score this rank's share (rank 0 gathers every window's exact
//! record) and assemble [`Results`] on rank 0.
//!
//! Cheap checks (configuration, model metadata, data, cross-rank agreement) all run before the
//! weights are loaded, so a bad input fails in well under a second, never after minutes of
//! compute.
//!
//! [`evaluate`] runs a world of `--ranks` threads in this process (the `local` backend) with
//! one shared copy of the weights; [`evaluate_rank`] is one rank of any backend (MPI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::comm::agreement::{self, AgreementError, Fingerprints};
use crate::comm::codec::CommDtype;
use crate::comm::group::{base, Group, Metered};
use crate::comm::{local, CommError, Communicator, TpBackend};
use crate::data::{self, windows, DataError, Method, WindowPlan};
use crate::eval::{ledger, stats, NllAccumulator};
use crate::fingerprint;
use crate::model::{
    device, gguf, memory, shard, DeviceSpec, GgufFile, Llama, LlamaConfig, ModelError, Partition,
    Precision, Quantize,
};
use crate::parallel::data_parallel::ModelScorer;
use crate::parallel::data_parallel::{self as dp, RunError};
use crate::parallel::mesh::{self, ParallelDims, RequestedDims};
use crate::parallel::model_parallel::StageRunner;
use crate::parallel::schedule::Schedule;
use crate::report::progress::{Progress, ProgressMode};
use crate::report::{
    DataInfo, MemoryReport, MeshInfo, MeshRank, ModelInfo, Results, RunInfo, SystemInfo, Timings,
    WindowRecord, WorldInfo, SCHEMA_VERSION,
};
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
    /// The field of a JSON Lines record that holds its text.
    pub text_field: String,
    pub batch_size: usize,
    pub threads: usize,
    pub precision: Precision,
    /// Where the model runs (`--device`).
    pub device: DeviceSpec,
    pub seed: u64,
    pub bootstrap_samples: usize,
    /// Ranks of the `local` backend (the MPI world size decides under `mpirun`).
    pub ranks: usize,
    pub schedule: Schedule,
    /// Requested parallel degrees (`--dp-replicate/--dp-shard/--tp/--pp/--cp`); resolved
    /// against the world size by [`EvalConfig::dims`].
    pub parallel: RequestedDims,
    /// Type of activations on the wire between model-parallel ranks.
    pub comm_dtype: CommDtype,
    /// Where tensor-parallel activations are summed (`--tp-backend`).
    pub tp_backend: TpBackend,
    /// Weights quantized at load (`--quantize`).
    pub quantize: Option<Quantize>,
    /// Run directory for the ledger (`--run-dir`, `--resume`); rank 0 picks a fresh one under
    /// `runs/` when absent.
    pub run_dir: Option<PathBuf>,
    /// Skip the windows the run directory's ledgers already hold (`--resume`).
    pub resume: bool,
    /// A benchmark task (`--task`): its documents and text, with `method` rolling.
    pub task: Option<crate::task::TaskSpec>,
}

impl EvalConfig {
    /// The options that decide which tokens are scored and how: every rank must agree on them.
    /// Batch size, threads, ranks and schedule are left out (they never change a result), and
    /// so is the seed (rank 0's is broadcast).
    fn scoring_json(&self) -> String {
        serde_json::json!({
            "method": self.method,
            "ctx": self.ctx,
            "stride": self.stride,
            "chunks": self.chunks,
            "max_tokens": self.max_tokens,
            "precision": self.precision,
            "device": self.device,
            "bootstrap_samples": self.bootstrap_samples,
            "parallel": self.parallel,
            "comm_dtype": self.comm_dtype,
            "tp_backend": self.tp_backend,
            "quantize": self.quantize,
            "task": self.task,
        })
        .to_string()
    }

    /// The options a window's value depends on, for the ledger's binding: unlike
    /// [`Self::scoring_json`] it leaves out the layout (world size, pp, dp_shard), which never
    /// changes a value, so a run can resume on another mesh; tensor parallelism and lossy
    /// activation compression do change values and are kept.
    fn values_json(&self, dims: &ParallelDims) -> String {
        let lossy = dims.tp > 1 || dims.pp > 1 || dims.cp > 1;
        let mut values = serde_json::json!({
            "method": self.method,
            "ctx": self.ctx,
            "stride": self.stride,
            "chunks": self.chunks,
            "max_tokens": self.max_tokens,
            "precision": self.precision,
            "tp": dims.tp,
            "comm_dtype": if lossy { self.comm_dtype } else { CommDtype::F32 },
            "quantize": self.quantize,
        });
        // Only named when set, so that ledgers written before tasks existed still resume.
        if let Some(task) = self.task {
            values["task"] = task.name.to_string().into();
        }
        // Ring attention sums in another order (named only when used, as above).
        if dims.cp > 1 {
            values["cp"] = dims.cp.into();
        }
        // A GPU's sums differ from the CPU's in the last bits: no mixing in one ledger. (Only
        // named when set, so that CPU ledgers written before GPUs existed still resume.)
        if !self.device.is_cpu() {
            values["on_gpu"] = true.into();
            if dims.tp > 1 {
                values["tp_backend"] = serde_json::json!(self.tp_backend);
            }
        }
        values.to_string()
    }

    /// Positions of a window one rank holds: `ctx`, or `ctx / cp` under context parallelism
    /// (what its activations and keys/values scale with, for the memory planner).
    pub fn positions_per_rank(&self) -> usize {
        let cp = self.parallel.cp.unwrap_or(1).max(1) as usize;
        self.ctx / cp
    }

    /// The mesh for a world of `world` ranks: plain data parallelism (every rank a whole
    /// replica) unless a parallel degree was given, then torchtune's rules.
    pub fn dims(&self, world: usize) -> Result<ParallelDims, EvalError> {
        if !self.parallel.any() {
            return Ok(ParallelDims {
                dp_replicate: world,
                dp_shard: 1,
                tp: 1,
                cp: 1,
                pp: 1,
            });
        }
        ParallelDims::resolve(&self.parallel, world).map_err(|e| EvalError::Config(e.to_string()))
    }
}

/// What rank `rank` of mesh `dims` holds of the model `mc`.
pub fn partition(dims: &ParallelDims, rank: usize, mc: &LlamaConfig) -> Partition {
    let c = dims.coords(rank);
    let n_layers = mc.n_layers;
    Partition {
        layers: mesh::stage_layers(n_layers, dims.pp, c.pp, head_cost_in_layers(mc)),
        embed: c.pp == 0,
        head: c.pp + 1 == dims.pp,
        tp_rank: c.tp,
        tp: dims.tp,
        fsdp_rank: c.dp_shard,
        fsdp: dims.dp_shard,
    }
}

/// The output layer's cost in transformer blocks, for balancing pipeline stages: its weights
/// over a block's, halved because `chunks` scores half the positions (attention left out).
pub fn head_cost_in_layers(mc: &LlamaConfig) -> usize {
    let d = mc.hidden_size as f64;
    let q = (mc.n_heads * mc.head_dim) as f64;
    let kv = (mc.n_kv_heads * mc.head_dim) as f64;
    let block = 2.0 * d * q + 2.0 * d * kv + 3.0 * d * mc.intermediate_size as f64;
    (mc.vocab_size as f64 * d / block / 2.0).round() as usize
}

/// Checks a mesh against the model before any weight is loaded.
pub fn check_mesh(
    dims: &ParallelDims,
    g: &GgufFile,
    mc: &LlamaConfig,
    quantize: Option<&Quantize>,
) -> Result<(), EvalError> {
    if dims.pp > mc.n_layers {
        return Err(EvalError::Config(format!(
            "--pp {} exceeds the model's {} layers: every pipeline stage needs at least one layer; use --pp {} or less",
            dims.pp, mc.n_layers, mc.n_layers
        )));
    }
    shard::check_tensor_parallel(g, mc, dims.tp, quantize)?;
    Ok(())
}

/// Every check of the configuration against the mesh, the model and this build that `eval`
/// makes before loading: `ppl validate` runs the same, so it passes exactly what `eval` runs.
pub fn check_plan(
    cfg: &EvalConfig,
    dims: &ParallelDims,
    g: &GgufFile,
    mc: &LlamaConfig,
) -> Result<(), EvalError> {
    check_mesh(dims, g, mc, cfg.quantize.as_ref())?;
    check_precision(cfg, dims)?;
    check_context_parallel(cfg, dims)?;
    check_device(cfg, dims)
}

/// `--cp`: whole chunks of equal windows (see [`crate::parallel::context_parallel`]).
fn check_context_parallel(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if dims.cp == 1 {
        return Ok(());
    }
    if cfg.method != Method::Chunks || cfg.task.is_some() {
        return Err(EvalError::Config(format!(
            "--cp {} works with --method chunks only: stride and rolling windows (and --task) differ in length, so they do not cut into 2·cp equal chunks; use --method chunks, or --cp 1",
            dims.cp
        )));
    }
    crate::parallel::context_parallel::check_window(dims.cp, cfg.ctx, "--ctx")
        .map_err(EvalError::Config)
}

/// bf16/f16 activations run on whole models only: the model-parallel paths exchange f32.
fn check_precision(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if matches!(cfg.precision, Precision::Bf16 | Precision::F16) && dims.splits_model() {
        return Err(EvalError::Config(format!(
            "--precision {} with pipeline, tensor or FSDP parallelism is not supported yet: use --precision f32 or native with --tp/--pp/--dp-shard, or {} with data parallelism only (--ranks N)",
            cfg.precision, cfg.precision
        )));
    }
    Ok(())
}

/// `--device` and `--tp-backend` against the build and the mesh.
fn check_device(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if !cfg.device.is_cpu() && !cfg!(feature = "cuda") {
        return Err(crate::model::DeviceError::NotBuilt(cfg.device).into());
    }
    if cfg.tp_backend == TpBackend::Nccl {
        if !cfg!(feature = "nccl") {
            return Err(EvalError::Config(
                "--tp-backend nccl: this ppl was built without NCCL support; rebuild it with `cargo build --release --features nccl` (see the README's GPU section), or use --tp-backend host".into(),
            ));
        }
        if cfg.device.is_cpu() {
            return Err(EvalError::Config(
                "--tp-backend nccl sums activations on GPUs: add --device cuda, or use --tp-backend host on the CPU".into(),
            ));
        }
        if dims.tp == 1 {
            return Err(EvalError::Config(
                "--tp-backend nccl has nothing to sum with tp = 1: set --tp N (N GPUs per replica) or drop --tp-backend".into(),
            ));
        }
    }
    Ok(())
}

/// Display and testing options that are not part of the scoring configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub progress: Option<ProgressMode>,
    pub print_chunks: bool,
    /// Testing aid: give one rank a different data file (`--debug-rank-data R=PATH`), to
    /// exercise the start-up agreement as a node with a different file would.
    pub rank_data: Option<(usize, PathBuf)>,
    /// The resolved configuration as a config file, saved in the run directory so that
    /// `--resume DIR` alone can restart the run.
    pub config_yaml: Option<String>,
    /// `--oversubscribe`: allow more local ranks than [`crate::preflight::local_rank_limit`].
    pub oversubscribe: bool,
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
    #[error(transparent)]
    Agreement(#[from] AgreementError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("rank {rank} stopped: {source}")]
    Rank { rank: usize, source: Box<EvalError> },
    #[error("{0}")]
    Memory(String),
    #[error(transparent)]
    Device(#[from] crate::model::DeviceError),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    BaseFile(#[from] crate::eval::base_file::BaseFileError),
}

impl From<RunError> for EvalError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Comm(c) => EvalError::Comm(c),
            RunError::Model(m) => EvalError::Model(m),
            RunError::Ledger(l) => EvalError::Ledger(l),
        }
    }
}

/// What the text became before any weight is loaded.
pub(crate) struct Prepared {
    pub(crate) plan: WindowPlan,
    documents: Option<(u64, u64, u64)>,
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

/// Everything a rank knows before the weights are loaded.
pub struct RankSetup {
    pub(crate) gguf: GgufFile,
    pub(crate) mc: LlamaConfig,
    pub(crate) tok: Tokenizer,
    data_path: PathBuf,
    pub(crate) text_sha256: String,
    text_len: u64,
    pub(crate) prepared: Prepared,
    tokenize_s: f64,
    seed: u64,
    started: Instant,
}

/// What this rank is about to evaluate, for the start-up agreement.
fn make_fingerprints(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    data_path: &Path,
    tok: &Tokenizer,
    data_sha256: &str,
) -> Result<Fingerprints, EvalError> {
    let model_sha256 = fingerprint::sha256_file_cached(&cfg.model).map_err(|e| {
        EvalError::Config(format!(
            "cannot read {} to fingerprint it: {e}",
            cfg.model.display()
        ))
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

/// Tells every rank's abort path how to go on from the windows finished in `run_dir`.
fn note_run_dir(run_dir: &Path) {
    let shown = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    crate::comm::set_abort_note(format!(
        "the windows finished so far are kept in {0}: resume with `ppl eval --resume {0}` \
         (under mpirun or `ppl launch` as before, on any number of ranks)",
        shown.display()
    ));
}

/// What rank 0 tells every rank before scoring: the ledger attempt number and the windows the
/// ledgers already hold.
#[derive(serde::Serialize, serde::Deserialize)]
struct ResumePlan {
    /// The run directory rank 0 chose (and created, now that the start-up checks passed).
    run_dir: PathBuf,
    attempt: usize,
    done: Vec<usize>,
}

/// Rank 0: reads the run directory's ledgers (when resuming) and saves the configuration.
fn plan_resume(
    cfg: &EvalConfig,
    setup: &RankSetup,
    binding: &ledger::Binding,
    opts: &RunOptions,
) -> Result<(ResumePlan, Vec<crate::eval::WindowResult>, Vec<String>), EvalError> {
    // Named (and, by default, created) only here: a run that fails its start-up checks
    // leaves no empty run directory behind.
    let dir = &match &cfg.run_dir {
        Some(d) => d.clone(),
        None => {
            let root = crate::eval::runs::runs_root();
            crate::eval::runs::claim_new(&root).map_err(|e| {
                EvalError::Config(format!(
                    "cannot create a run directory under {}: {e}; give a writable --run-dir DIR (or set PPL_STATE_DIR)",
                    root.display()
                ))
            })?
        }
    };
    let (done, notes) = if cfg.resume {
        let (done, notes) = ledger::load(dir, binding)?;
        let plan = &setup.prepared.plan;
        for r in &done {
            let expected = plan.windows.get(r.index).map_or(0, |w| w.targets.len());
            ledger::check_record(dir, r, expected)?;
        }
        (done, notes)
    } else {
        (Vec::new(), Vec::new())
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        EvalError::Config(format!(
            "cannot create the run directory {}: {e}; give a writable --run-dir",
            dir.display()
        ))
    })?;
    if let Some(yaml) = &opts.config_yaml {
        let path = dir.join("config.yaml");
        if !path.exists() {
            std::fs::write(&path, yaml)
                .map_err(|e| EvalError::Config(format!("cannot write {}: {e}", path.display())))?;
        }
    }
    for n in &notes {
        tracing::warn!("{n}");
    }
    if !matches!(opts.progress, Some(ProgressMode::None)) && !cfg.resume {
        let shown = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        eprintln!(
            "[ppl] run directory {0} (if stopped: ppl eval --resume {0})",
            shown.display()
        );
    }
    Ok((
        ResumePlan {
            run_dir: dir.clone(),
            attempt: ledger::next_attempt(dir),
            done: done.iter().map(|r| r.index).collect(),
        },
        done,
        notes,
    ))
}

/// Phase two on every rank: score this rank's share; rank 0 returns the results.
#[allow(clippy::too_many_arguments)]
pub fn run_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    setup: &RankSetup,
    model: &Llama,
    load_s: f64,
    threads: usize,
    progress: Option<&Mutex<Progress>>,
    opts: &RunOptions,
) -> Result<Option<Results>, EvalError> {
    let plan = &setup.prepared.plan;
    let dims = cfg.dims(comm.size())?;
    // The ledger: rank 0 reads what a previous attempt recorded (--resume) and every rank
    // learns which windows are left.
    let binding = ledger::Binding {
        model_sha256: fingerprint::sha256_file_cached(&cfg.model)
            .map_err(|e| EvalError::Config(format!("cannot read {}: {e}", cfg.model.display())))?,
        data_sha256: setup.text_sha256.clone(),
        tokenizer_sha256: setup.tok.fingerprint.clone(),
        config: cfg.values_json(&dims),
        windows: plan.windows.len(),
    };
    let (resume_plan, done, notes) = if comm.rank() == 0 {
        match plan_resume(cfg, setup, &binding, opts) {
            Ok((p, done, notes)) => {
                comm.broadcast(0, serde_json::to_vec(&p).expect("plans serialize"))?;
                (p, done, notes)
            }
            Err(e) => {
                comm.abort(&e.to_string());
                return Err(e);
            }
        }
    } else {
        let b = comm.broadcast(0, Vec::new())?;
        let p: ResumePlan = serde_json::from_slice(&b).map_err(|e| CommError::Protocol {
            from: 0,
            detail: e.to_string(),
        })?;
        (p, Vec::new(), Vec::new())
    };
    note_run_dir(&resume_plan.run_dir);
    let done_set: std::collections::HashSet<usize> = resume_plan.done.iter().copied().collect();
    let todo: Vec<usize> = (0..plan.windows.len())
        .filter(|i| !done_set.contains(i))
        .collect();
    let from_ledger = resume_plan.done.len();
    let work = dp::Work {
        windows: &plan.windows,
        todo,
        done,
        batch_size: cfg.batch_size,
        schedule: cfg.schedule,
        threads,
    };
    let new_ledger = || -> Result<ledger::LedgerWriter, EvalError> {
        ledger::LedgerWriter::create(
            &resume_plan.run_dir,
            comm.rank(),
            resume_plan.attempt,
            binding.clone(),
        )
        .map_err(|e| {
            comm.abort(&e.to_string());
            e.into()
        })
    };
    let t_eval = Instant::now();
    let on_results = |r: &[crate::eval::WindowResult]| {
        if let Some(p) = progress {
            p.lock().unwrap_or_else(|e| e.into_inner()).update(r);
        }
    };
    let (gathered, mesh_info) = if !dims.splits_model() {
        let mut scorer = ModelScorer {
            model,
            windows: &plan.windows,
        };
        let mut ledger = new_ledger()?;
        let g = dp::run(comm, &mut scorer, work, Some(&mut ledger), on_results)?;
        (g, None)
    } else {
        // Model-parallel traffic and the data-parallel protocol's are metered apart: the
        // first is timed per step, the second is timed by the protocol itself.
        let metered = Metered::new(comm);
        let dp_metered = Metered::new(comm);
        let mut runner = StageRunner::new(&metered, dims, model, &plan.windows, cfg.comm_dtype);
        if cfg.tp_backend == TpBackend::Nccl {
            runner = runner
                .with_nccl()
                .inspect_err(|e| comm.abort(&e.to_string()))?;
        }
        let gathered = if runner.is_leader() {
            let replicas = Group::new(&dp_metered, dims.leaders(), base::DATA_PARALLEL);
            let mut ledger = new_ledger()?;
            dp::run(&replicas, &mut runner, work, Some(&mut ledger), on_results)?
        } else {
            if let Err(e) = runner.follow() {
                comm.abort(&e.to_string());
                return Err(e.into());
            }
            None
        };
        let traffic = metered.traffic();
        let dp_traffic = dp_metered.traffic();
        let part = &model.partition;
        let me = MeshRank {
            rank: comm.rank(),
            host: comm.host(),
            coords: dims.coords(comm.rank()),
            layers: [part.layers.start, part.layers.end],
            embedding: part.embed,
            output: part.head,
            weights_bytes: model.weights_bytes(),
            peak_rss_bytes: fingerprint::peak_rss_bytes(),
            bytes_sent: traffic.bytes_sent + dp_traffic.bytes_sent,
            bytes_received: traffic.bytes_received + dp_traffic.bytes_received,
            comm_s: traffic.seconds,
            compute_s: (runner.figures.busy_s - runner.figures.step_comm_s).max(0.0),
            steps: runner.figures.steps,
            ring_bytes_sent: runner.ring.bytes(),
            ring_s: runner.ring.seconds(),
        };
        let all = metered.gather(0, serde_json::to_vec(&me).expect("mesh figures serialize"))?;
        let Some(all) = all else {
            return Ok(None);
        };
        let ranks = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice::<MeshRank>(b).map_err(|e| {
                    EvalError::Comm(CommError::Protocol {
                        from: r,
                        detail: e.to_string(),
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        (
            gathered,
            Some(MeshInfo {
                dims,
                comm_dtype: cfg.comm_dtype,
                layout: dims.describe(),
                ranks,
            }),
        )
    };
    let eval_s = t_eval.elapsed().as_secs_f64();
    let Some(gathered) = gathered else {
        return Ok(None);
    };
    if let Some(p) = progress {
        p.lock().unwrap_or_else(|e| e.into_inner()).finish();
    }
    let results = gathered.results;

    let mut total = NllAccumulator::default();
    let mut groups: BTreeMap<usize, NllAccumulator> = BTreeMap::new();
    for r in &results {
        total.merge(&r.acc);
        groups.entry(r.group).or_default().merge(&r.acc);
    }
    let blocks: Vec<NllAccumulator> = groups.into_values().collect();
    let mean_nll = total.mean().unwrap_or(f64::NAN);
    let nll_sum = total.nll_sum();
    let (word_ppl, byte_ppl, bpb) = match setup.prepared.documents {
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
            nll_sum_sq: crate::eval::accumulator::from_fixed(r.acc.sum_sq),
            rank: r.rank,
            finished_s: r.finished_s,
            nll_sum_fixed: r.acc.sum,
        })
        .collect();
    let hardest = hardest_windows(&plan.windows, &results, &setup.tok, HARDEST);
    let mut tensor_types = BTreeMap::new();
    for t in setup.gguf.tensors.values() {
        *tensor_types
            .entry(gguf::ggml_type_name(t.type_id))
            .or_insert(0) += 1;
    }
    // Throughput counts the windows computed in this attempt: those from the ledger took no
    // time here.
    let (input_tokens, scored_tokens) = results
        .iter()
        .filter(|r| !done_set.contains(&r.index))
        .fold((0usize, 0u64), |(i, s), r| {
            (i + r.input_tokens, s + r.acc.count)
        });
    let mc = &setup.mc;
    let tok = &setup.tok;
    let documents = setup.prepared.documents;
    Ok(Some(Results {
        schema_version: SCHEMA_VERSION,
        ppl_version: env!("CARGO_PKG_VERSION").to_string(),
        ppl: mean_nll.exp(),
        ppl_err: stats::ppl_error(&total),
        ci95: stats::bootstrap_ci95(&blocks, cfg.bootstrap_samples, setup.seed),
        tokens: total.count,
        mean_nll,
        nll_sum,
        accumulator: total,
        word_perplexity: word_ppl,
        byte_perplexity: byte_ppl,
        bits_per_byte: bpb,
        config: serde_json::to_value(EvalConfig {
            seed: setup.seed,
            ..cfg.clone()
        })
        .expect("config serializes"),
        model: ModelInfo {
            path: cfg.model.display().to_string(),
            sha256: fingerprint::sha256_file_cached(&cfg.model).map_err(|e| {
                EvalError::Config(format!(
                    "cannot read {} to fingerprint it: {e}",
                    cfg.model.display()
                ))
            })?,
            file_bytes: setup.gguf.file_bytes(),
            architecture: mc.architecture.clone(),
            parameters: mc.parameters(),
            vocab_size: mc.vocab_size,
            context_length: mc.context_length,
            layers: mc.n_layers,
            tensor_types,
            tokenizer: tok.kind.clone(),
            tokenizer_pre: tok.pre.clone(),
            tokenizer_sha256: tok.fingerprint.clone(),
            add_bos: tok.add_bos,
        },
        data: DataInfo {
            path: setup.data_path.display().to_string(),
            sha256: setup.text_sha256.clone(),
            bytes: setup.text_len,
            stream_tokens: plan.stream_tokens as u64,
            documents: documents.map(|d| d.0),
            words: documents.map(|d| d.1),
        },
        windows,
        timings: Timings {
            load_s,
            tokenize_s: setup.tokenize_s,
            eval_s,
            total_s: setup.started.elapsed().as_secs_f64(),
            tokens_per_s: input_tokens as f64 / eval_s,
            scored_tokens_per_s: scored_tokens as f64 / eval_s,
        },
        system: SystemInfo {
            threads: cfg.threads,
            cpu_features: fingerprint::cpu_features()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            peak_rss_bytes: fingerprint::peak_rss_bytes(),
            host: Some(comm.host()),
            kernels: Some(crate::report::KernelIsa::detect()),
        },
        world: WorldInfo {
            backend: comm.backend().to_string(),
            size: comm.size(),
            schedule: cfg.schedule,
        },
        ranks: gathered.ranks,
        mesh: mesh_info,
        run: Some(RunInfo {
            dir: resume_plan.run_dir.display().to_string(),
            attempt: resume_plan.attempt,
            resumed: cfg.resume,
            windows_from_ledger: from_ledger,
            ledger_notes: notes,
        }),
        hardest,
        memory: None,
        determinism: Some(device::Determinism::for_device(&match cfg.device {
            DeviceSpec::Cuda(None) if comm.size() > 1 => "cuda (a GPU per local rank)".into(),
            _ => device::device_name(model.device()),
        })),
        warnings: crate::report::plausibility(mean_nll.exp(), mc.vocab_size)
            .into_iter()
            .collect(),
    }))
}

/// Windows listed in `results.json` under `hardest`.
const HARDEST: usize = 10;
/// Scored tokens decoded into each excerpt.
const EXCERPT_TOKENS: usize = 40;

/// The `n` windows with the highest mean NLL, with the start of the text each one scored.
fn hardest_windows(
    windows: &[windows::Window],
    results: &[crate::eval::WindowResult],
    tok: &Tokenizer,
    n: usize,
) -> Vec<crate::report::HardWindow> {
    let mut order: Vec<usize> = (0..results.len())
        .filter(|&i| results[i].acc.count > 0)
        .collect();
    order.sort_by(|&a, &b| {
        let (ma, mb) = (
            results[a].acc.mean().unwrap_or(0.0),
            results[b].acc.mean().unwrap_or(0.0),
        );
        mb.total_cmp(&ma).then(a.cmp(&b))
    });
    order
        .into_iter()
        .take(n)
        .map(|i| {
            let w = &windows[i];
            let ids = &w.targets[..w.targets.len().min(EXCERPT_TOKENS)];
            crate::report::HardWindow {
                index: i,
                mean_nll: results[i].acc.mean().unwrap_or(f64::NAN),
                excerpt: tok.decode(ids),
            }
        })
        .collect()
}

/// Threads each of `ranks` ranks gets out of `threads` (at least one).
pub fn threads_per_rank(threads: usize, ranks: usize) -> usize {
    (threads / ranks.max(1)).max(1)
}

fn new_progress(opts: &RunOptions, plan: &WindowPlan) -> Mutex<Progress> {
    let input_tokens: usize = plan.windows.iter().map(|w| w.input.len()).sum();
    Mutex::new(Progress::new(
        opts.progress.unwrap_or(ProgressMode::Auto),
        opts.print_chunks,
        plan.windows.len(),
        input_tokens,
    ))
}

/// One rank of any backend, start to finish (used by the MPI launch). Rank 0 returns the
/// results; the others return `None`.
pub fn evaluate_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    opts: &RunOptions,
) -> Result<Option<Results>, EvalError> {
    let data = match &opts.rank_data {
        Some((r, p)) if *r == comm.rank() => p.clone(),
        _ => cfg.data.clone(),
    };
    let setup = match setup_rank(comm, cfg, &data) {
        Ok(s) => s,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let part = match cfg.dims(comm.size()) {
        Ok(dims) => partition(&dims, comm.rank(), &setup.mc),
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let memory = match plan_memory(
        cfg,
        &setup,
        1,
        crate::comm::launcher::ranks_on_this_node(),
        std::slice::from_ref(&part),
    ) {
        Ok(m) => m,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let t_load = Instant::now();
    let model = match cfg
        .device
        .open(crate::comm::launcher::local_rank())
        .map_err(EvalError::from)
        .and_then(|d| {
            Ok(Llama::load(
                &setup.gguf,
                cfg.precision,
                &part,
                cfg.quantize,
                &d,
            )?)
        }) {
        Ok(m) => m,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let load_s = t_load.elapsed().as_secs_f64();
    let progress = (comm.rank() == 0).then(|| new_progress(opts, &setup.prepared.plan));
    let results = run_rank(
        comm,
        cfg,
        &setup,
        &model,
        load_s,
        cfg.threads,
        progress.as_ref(),
        opts,
    )?;
    Ok(results.map(|r| Results {
        memory: Some(memory),
        ..r
    }))
}

/// Estimates this process's peak memory and refuses, before loading, a run that cannot fit,
/// with the estimate and the cheapest remedies.
fn plan_memory(
    cfg: &EvalConfig,
    setup: &RankSetup,
    ranks_in_process: usize,
    processes_on_node: usize,
    parts: &[Partition],
) -> Result<MemoryReport, EvalError> {
    let est_parts = |precision, batch, ranks, parts: &[Partition]| {
        memory::estimate(
            &setup.gguf,
            &setup.mc,
            precision,
            batch,
            cfg.positions_per_rank(),
            ranks,
            setup.tok.vocab_size,
            parts,
        )
    };
    let est = |precision, batch, ranks| est_parts(precision, batch, ranks, parts);
    let e = est(cfg.precision, cfg.batch_size, ranks_in_process);
    let available = memory::available_bytes();
    let report = MemoryReport {
        estimate: e.clone(),
        available_bytes: available
            .as_ref()
            .map(|a| a.0 / processes_on_node.max(1) as u64),
        available_source: available.as_ref().map(|a| a.1.clone()),
    };
    let Some(budget) = report.available_bytes else {
        return Ok(report);
    };
    if e.total_bytes <= budget {
        return Ok(report);
    }
    let mut remedies = Vec::new();
    let mut consider = |what: &str, alt: memory::MemoryEstimate| {
        if alt.total_bytes < e.total_bytes {
            let fits = if alt.total_bytes <= budget {
                "fits"
            } else {
                "still too much"
            };
            remedies.push(format!(
                "  {what}: {} ({fits})",
                memory::mib(alt.total_bytes)
            ));
        }
    };
    if cfg.batch_size > 1 {
        consider(
            "--batch-size 1 (same result)",
            est(cfg.precision, 1, ranks_in_process),
        );
    }
    if ranks_in_process > 1 {
        consider(
            "--ranks 1, or ranks as MPI processes on more nodes (same result)",
            est(cfg.precision, cfg.batch_size, 1),
        );
    }
    if cfg.precision == Precision::F32 {
        consider(
            "--precision native (quantized weights as stored)",
            est(Precision::Native, cfg.batch_size, ranks_in_process),
        );
    }
    // The model split over two nodes, one process each: the larger share.
    let whole_model = parts
        .iter()
        .all(|p| p.layers.len() == setup.mc.n_layers && p.tp == 1);
    if whole_model && matches!(cfg.precision, Precision::Native | Precision::F32) {
        let split = |dims: ParallelDims| {
            (0..dims.world())
                .map(|r| {
                    let part = partition(&dims, r, &setup.mc);
                    est_parts(
                        cfg.precision,
                        cfg.batch_size,
                        1,
                        std::slice::from_ref(&part),
                    )
                })
                .max_by_key(|e| e.total_bytes)
                .expect("a mesh has ranks")
        };
        let two = |pp, dp_shard| ParallelDims {
            dp_replicate: 1,
            dp_shard,
            tp: 1,
            cp: 1,
            pp,
        };
        consider(
            "--pp 2 over two nodes, one rank each (same result)",
            split(two(2, 1)),
        );
        consider(
            "--dp-shard 2 over two nodes, one rank each (same result)",
            split(two(1, 2)),
        );
    }
    Err(EvalError::Memory(format!(
        "not enough memory: this run needs about {} (weights {}, activations {} and logits {} per rank × {} rank(s), other {}) but {} allows {}{}; nothing was loaded. Cheapest remedies:\n{}",
        memory::mib(e.total_bytes),
        memory::mib(e.weights_bytes),
        memory::mib(e.activations_bytes),
        memory::mib(e.logits_bytes),
        e.ranks_in_process,
        memory::mib(e.other_bytes),
        report.available_source.as_deref().unwrap_or("the system"),
        memory::mib(budget),
        if processes_on_node > 1 {
            format!(" (its share of {processes_on_node} ranks on this node)")
        } else {
            String::new()
        },
        remedies.join("\n")
    )))
}

/// Runs `cfg.ranks` ranks as threads of this process (the `local` backend): each rank checks
/// and tokenizes its input, the weights are loaded once and shared read-only, then each rank
/// scores its share on `threads / ranks` threads of its own pool.
pub fn evaluate(cfg: &EvalConfig, opts: &RunOptions) -> Result<Results, EvalError> {
    let n = cfg.ranks.max(1);
    check_before_ranks(cfg, n, opts)?;
    let comms = local::world(n);
    let per_rank = threads_per_rank(cfg.threads, n);
    let data_for = |rank: usize| match &opts.rank_data {
        Some((r, p)) if *r == rank => p.clone(),
        _ => cfg.data.clone(),
    };

    // Phase one on every rank; the first failure (in rank order) is reported.
    let setups: Vec<Result<RankSetup, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let data = data_for(c.rank());
                s.spawn(move || {
                    let r = setup_rank(c, cfg, &data);
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
    let dims = cfg.dims(n)?;
    let mc = &setups[0].mc;
    // Ranks holding the same part of the model share one copy of it.
    let rank_parts: Vec<Partition> = (0..n)
        .map(|r| {
            if dims.splits_model() {
                partition(&dims, r, mc)
            } else {
                Partition::full(mc.n_layers)
            }
        })
        .collect();
    let mut parts: Vec<Partition> = Vec::new();
    for p in &rank_parts {
        if !parts.contains(p) {
            parts.push(p.clone());
        }
    }
    let memory = plan_memory(cfg, &setups[0], n, 1, &parts)?;

    // Each rank's device: the CPU for all, or a GPU each (`cuda`) or one for all (`cuda:N`);
    // a device is opened once, and ranks on one device share a part's copy of the weights.
    let mut devices: Vec<(usize, candle_core::Device)> = Vec::new();
    let mut rank_devices = Vec::with_capacity(n);
    for r in 0..n {
        let ordinal = cfg.device.ordinal(r).unwrap_or(0);
        if !devices.iter().any(|(o, _)| *o == ordinal) {
            devices.push((ordinal, cfg.device.open(r)?));
        }
        rank_devices.push(ordinal);
    }
    let mut loads: Vec<(Partition, usize)> = Vec::new();
    for (p, &d) in rank_parts.iter().zip(&rank_devices) {
        if !loads.contains(&(p.clone(), d)) {
            loads.push((p.clone(), d));
        }
    }
    let t_load = Instant::now();
    let models = loads
        .iter()
        .map(|(p, d)| {
            let device = &devices.iter().find(|(o, _)| o == d).expect("opened").1;
            Llama::load(&setups[0].gguf, cfg.precision, p, cfg.quantize, device)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model_of = |rank: usize| {
        let key = (rank_parts[rank].clone(), rank_devices[rank]);
        let i = loads
            .iter()
            .position(|l| *l == key)
            .expect("every rank's part was loaded");
        &models[i]
    };
    let load_s = t_load.elapsed().as_secs_f64();
    tracing::info!(
        "{} model part(s) loaded for {n} rank(s) in {load_s:.2} s ({} precision, {})",
        loads.len(),
        cfg.precision,
        cfg.device
    );
    let progress = new_progress(opts, &setups[0].prepared.plan);
    let memory = &memory;

    let outcomes: Vec<Result<Option<Results>, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&setups)
            .map(|(c, setup)| {
                let (model, progress) = (model_of(c.rank()), &progress);
                s.spawn(move || -> Result<Option<Results>, EvalError> {
                    let rank = c.rank();
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(per_rank)
                        .thread_name(move |i| format!("ppl-rank{rank}-{i}"))
                        .build()
                        .map_err(|e| {
                            EvalError::Config(format!("cannot start compute threads: {e}"))
                        })?;
                    let progress = (c.rank() == 0).then_some(progress);
                    // A panicking rank tells the others at once (they would otherwise wait
                    // for it until PPL_COMM_TIMEOUT) and is reported by number.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        pool.install(|| {
                            run_rank(c, cfg, setup, model, load_s, per_rank, progress, opts)
                                .map(|r| {
                                    r.map(|r| Results {
                                        memory: Some(memory.clone()),
                                        ..r
                                    })
                                })
                        })
                    }));
                    outcome.unwrap_or_else(|payload| {
                        let msg = format!(
                            "rank {rank} ({}) panicked: {}",
                            c.host(),
                            panic_message(payload.as_ref())
                        );
                        c.abort(&msg);
                        Err(EvalError::Config(format!(
                            "{msg}; the ledger in the run directory keeps every window finished before it (resume with --resume)"
                        )))
                    })
                })
            })
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    let mut outcomes = first_error(outcomes)?;
    outcomes
        .swap_remove(0)
        .ok_or_else(|| EvalError::Config("rank 0 returned no results".into()))
}

/// Checks made once, before any rank exists: the model against the configuration and the
/// mesh (so `--pp 1000` is refused by the model's layer count, not after building 1000
/// ranks), then the number of local ranks against the machine.
fn check_before_ranks(cfg: &EvalConfig, n: usize, opts: &RunOptions) -> Result<(), EvalError> {
    let gguf = GgufFile::open(&cfg.model)?;
    let mc = LlamaConfig::from_gguf(&gguf)?;
    check_config(cfg, &mc)?;
    let dims = cfg.dims(n)?;
    check_mesh(&dims, &gguf, &mc, cfg.quantize.as_ref())?;
    crate::preflight::check_local_ranks(n, opts.oversubscribe).map_err(EvalError::Config)
}

/// A rank thread's result; a panic becomes an error naming the rank instead of tearing down
/// the process.
pub(crate) fn join_rank<T>(
    h: std::thread::ScopedJoinHandle<'_, Result<T, EvalError>>,
) -> Result<T, EvalError> {
    h.join().unwrap_or_else(|payload| {
        Err(EvalError::Config(format!(
            "a rank thread panicked: {}",
            panic_message(payload.as_ref())
        )))
    })
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// The most informative error among ranks: a rank's own failure before the echoes of it
/// (other ranks report "rank N failed" once it aborts).
pub(crate) fn first_error<T>(all: Vec<Result<T, EvalError>>) -> Result<Vec<T>, EvalError> {
    let mut errors: Vec<(usize, EvalError)> = Vec::new();
    let mut ok = Vec::with_capacity(all.len());
    for (rank, r) in all.into_iter().enumerate() {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => errors.push((rank, e)),
        }
    }
    if errors.is_empty() {
        return Ok(ok);
    }
    let primary = errors
        .iter()
        .position(|(_, e)| !matches!(e, EvalError::Comm(CommError::RankFailed { .. })))
        .unwrap_or(0);
    let (rank, e) = errors.swap_remove(primary);
    Err(match e {
        e @ (EvalError::Agreement(_) | EvalError::Comm(_)) => e,
        e if rank == 0 => e,
        e => EvalError::Rank {
            rank,
            source: Box::new(e),
        },
    })
}
