//! The resolved evaluation configuration ([`EvalConfig`]), the display options that are not
//! part of it ([`RunOptions`]), and what follows from it alone: each rank's part of the model
//! and its threads.

use std::path::PathBuf;

use serde::Serialize;

use super::error::EvalError;
use crate::comm::codec::CommDtype;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::{DeviceSpec, LlamaConfig, Partition, Precision, Quantize};
use crate::parallel::mesh::{self, ParallelDims, RequestedDims};
use crate::parallel::schedule::Schedule;
use crate::report::progress::ProgressMode;

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
    pub(crate) fn scoring_json(&self) -> String {
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
    pub(crate) fn values_json(&self, dims: &ParallelDims) -> String {
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
        Ok(ParallelDims::resolve(&self.parallel, world)?)
    }
}

/// Display and testing options that are not part of the scoring configuration.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The command a stopped run resumes with (`ppl eval`, `ppl compare`), for the messages.
    pub command: &'static str,
    /// Other files saved beside `config.yaml` in a new run directory, as (name, text): what
    /// else `--resume DIR` alone needs (`ppl compare`'s base).
    pub saved_files: Vec<(&'static str, String)>,
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

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            command: "ppl eval",
            saved_files: Vec::new(),
            progress: None,
            print_chunks: false,
            rank_data: None,
            config_yaml: None,
            oversubscribe: false,
        }
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

/// Threads each of `ranks` ranks gets out of `threads` (at least one).
pub fn threads_per_rank(threads: usize, ranks: usize) -> usize {
    (threads / ranks.max(1)).max(1)
}
