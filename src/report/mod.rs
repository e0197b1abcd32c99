//! Results: the versioned `results.json` schema ([`Results`]), writing it atomically, the
//! final summary, and live progress ([`progress`]).
//!
//! # `results.json`, schema version 1
//! | field | meaning |
//! |---|---|
//! | `schema_version` | 1 |
//! | `ppl` | exp(`mean_nll`) |
//! | `ppl_err` | llama.cpp's ± (delta method); null with < 2 tokens |
//! | `ci95` | `[lo, hi]` block-bootstrap 95% interval; null with < 2 blocks |
//! | `tokens` | scored tokens |
//! | `mean_nll` | mean NLL per scored token (nats) |
//! | `nll_sum`, `accumulator` | total NLL; its exact fixed-point sums (decimal strings, 2^-64 units) |
//! | `word_perplexity`, `byte_perplexity`, `bits_per_byte` | `rolling` only (lm-eval definitions) |
//! | `windows[]` | `index`, `group`, `start`, `input_tokens`, `tokens`, `nll_sum`, `nll_sum_fixed` |
//! | `config` | the resolved configuration |
//! | `model`, `data` | paths, SHA-256 fingerprints, sizes, architecture, tokenizer |
//! | `timings` | seconds for load, tokenize, eval, total; tokens/s |
//! | `warnings` | why the PPL cannot be a real model's (far above the vocabulary size, exactly 1, not finite); absent when plausible |
//! | `system` | threads, CPU features, peak RSS bytes, `kernels` (instruction-set level used, advertised, cap) |
//! | `world` | backend, size (ranks), schedule |
//! | `ranks[]` | per rank: host, windows, tokens, compute/comm/idle seconds, tokens/s, peak RSS |
//! | `hardest[]` | the 10 windows with the highest mean NLL: `index`, `mean_nll`, `excerpt` |
//! | `memory` | the planner's estimate (`estimate.total_bytes`, parts) and the memory available |

pub mod compare;
pub mod comparison;
pub mod comparison_text;
pub mod html;
pub mod json;
pub mod markdown;
pub mod progress;
pub mod svg;
pub mod text;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use crate::eval::NllAccumulator;

pub const SCHEMA_VERSION: u32 = 1;

/// Output formats of `ppl report`, one module each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Html,
    Md,
    Txt,
    Json,
}

/// Renders runs in a format (the exporter per format lives in its own module).
pub fn render(format: Format, runs: &[compare::NamedRun]) -> String {
    match format {
        Format::Html => html::render(runs),
        Format::Md => markdown::render(runs),
        Format::Txt => text::render(runs),
        Format::Json => json::render(runs),
    }
}

/// Reads a `results.json`.
pub fn load(path: &Path) -> Result<Results, String> {
    use std::io::Read;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        let kind = crate::preflight::special_file_kind(path).unwrap_or("a directory");
        return Err(format!(
            "{shown} is {kind}, not a results file; give the results.json a run wrote (--output)"
        ));
    }
    if meta.len() > MAX_RESULTS_BYTES {
        return Err(format!(
            "{shown} is {} MiB, larger than any ppl results file ({} MiB at most); give the results.json a run wrote (--output)",
            meta.len() >> 20,
            MAX_RESULTS_BYTES >> 20
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_RESULTS_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let version: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{shown} is not a ppl results file: {e}"))?;
    match version.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => {}
        Some(v) => {
            return Err(format!(
                "{shown} has schema_version {v}, but this ppl reads version {SCHEMA_VERSION}; use the ppl version that wrote it (its ppl_version field), or re-run the evaluation"
            ))
        }
        None => {
            return Err(format!(
                "{shown} is not a ppl results file: no schema_version field"
            ))
        }
    }
    serde_json::from_value(version).map_err(|e| format!("{shown} is not a ppl results file: {e}"))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    pub schema_version: u32,
    pub ppl_version: String,
    pub ppl: f64,
    pub ppl_err: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub tokens: u64,
    pub mean_nll: f64,
    pub nll_sum: f64,
    pub accumulator: NllAccumulator,
    pub word_perplexity: Option<f64>,
    pub byte_perplexity: Option<f64>,
    pub bits_per_byte: Option<f64>,
    pub config: serde_json::Value,
    pub model: ModelInfo,
    pub data: DataInfo,
    pub windows: Vec<WindowRecord>,
    pub timings: Timings,
    pub system: SystemInfo,
    pub world: WorldInfo,
    /// Per-replica figures, by data-parallel rank (every rank when each holds the whole
    /// model; the replica leaders under model parallelism, with `mesh` for every rank).
    pub ranks: Vec<crate::parallel::data_parallel::RankStats>,
    /// The model-parallel mesh and every rank's figures; absent when each rank holds the
    /// whole model.
    #[serde(default)]
    pub mesh: Option<MeshInfo>,
    /// The run directory and its ledger.
    #[serde(default)]
    pub run: Option<RunInfo>,
    /// The windows with the highest mean NLL, with the text they scored.
    #[serde(default)]
    pub hardest: Vec<HardWindow>,
    /// The memory planner's estimate for this process (compare with `system.peak_rss_bytes`).
    #[serde(default)]
    pub memory: Option<MemoryReport>,
    /// What repeats bit for bit on the device this run used (absent in older files).
    #[serde(default)]
    pub determinism: Option<crate::model::device::Determinism>,
    /// Why this PPL cannot be a real model's on real text ([`plausibility`]); empty when it
    /// can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Results files larger than this are refused by [`load`] (a real one is a few MB even with
/// hundreds of thousands of windows); `/dev/zero` would otherwise be read until the OOM killer.
pub const MAX_RESULTS_BYTES: u64 = 256 << 20;

/// What is implausible about a perplexity over a vocabulary of `vocab` tokens, if anything.
/// A uniform guess scores exactly `vocab`; a model far above it (100×) is worse than guessing by
/// orders of magnitude (corrupt weights); exactly 1 means every token was predicted with
/// certainty, which no language model does on real text (a constant or broken computation).
pub fn plausibility(ppl: f64, vocab: usize) -> Option<String> {
    let vocab = vocab.max(1) as f64;
    if !ppl.is_finite() {
        Some(format!(
            "PPL {ppl} is not finite: the model's predictions are broken (corrupt weights?); this result is meaningless"
        ))
    } else if ppl <= 1.0 {
        Some(format!(
            "PPL {ppl} means every token was predicted with certainty, which no model does on real text: the computation or the model is broken; this result is meaningless"
        ))
    } else if ppl > 100.0 * vocab {
        Some(format!(
            "PPL {ppl:.4e} is over 100 times the vocabulary size {vocab} (a uniform guess scores {vocab}): the weights are likely corrupt; this result is meaningless"
        ))
    } else {
        None
    }
}

/// The planner's figures, recorded next to the measured peak RSS.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemoryReport {
    pub estimate: crate::model::memory::MemoryEstimate,
    /// What the process could use (its share of the node under MPI).
    pub available_bytes: Option<u64>,
    pub available_source: Option<String>,
}

/// A window with a high mean NLL and an excerpt of the text it scored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HardWindow {
    pub index: usize,
    pub mean_nll: f64,
    /// The first scored tokens, decoded.
    pub excerpt: String,
}

/// Where a run's ledger lives and what a resume took from it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunInfo {
    pub dir: String,
    /// 0 for a first run, then one more per resume.
    pub attempt: usize,
    pub resumed: bool,
    /// Windows whose records came from earlier attempts' ledgers (not recomputed).
    pub windows_from_ledger: usize,
    /// Torn or corrupt ledger tails that were dropped (their windows were recomputed).
    pub ledger_notes: Vec<String>,
}

/// A model-parallel run's mesh.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MeshInfo {
    pub dims: crate::parallel::mesh::ParallelDims,
    pub comm_dtype: crate::comm::codec::CommDtype,
    /// Which ranks form each replica's stages and TP groups.
    pub layout: String,
    /// Every rank, by world rank.
    pub ranks: Vec<MeshRank>,
}

/// One rank of a model-parallel run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MeshRank {
    pub rank: usize,
    pub host: String,
    pub coords: crate::parallel::mesh::Coords,
    /// Blocks held, `[first, end)`.
    pub layers: [usize; 2],
    /// Whether it holds the token embedding / the output layer.
    pub embedding: bool,
    pub output: bool,
    /// Bytes of weights held (FSDP pieces as stored).
    pub weights_bytes: u64,
    /// Peak RSS of the rank's process (shared by all ranks of the `local` backend).
    pub peak_rss_bytes: Option<u64>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Seconds inside sends and receives (waiting for a peer included).
    pub comm_s: f64,
    /// Seconds computing inside steps.
    pub compute_s: f64,
    /// Steps (micro-batches, idle FSDP steps included) this rank ran.
    pub steps: u64,
    /// Bytes of keys and values this rank sent around the context-parallel ring (part of
    /// `bytes_sent`; 0 without `--cp`).
    #[serde(default)]
    pub ring_bytes_sent: u64,
    /// Seconds inside the ring's sends and receives (part of `comm_s`): what the ring did not
    /// hide behind attention.
    #[serde(default)]
    pub ring_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorldInfo {
    /// "local" or "mpi".
    pub backend: String,
    pub size: usize,
    pub schedule: crate::parallel::schedule::Schedule,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelInfo {
    pub path: String,
    pub sha256: String,
    pub file_bytes: u64,
    pub architecture: String,
    pub parameters: u64,
    pub vocab_size: usize,
    pub context_length: usize,
    pub layers: usize,
    /// Tensor count per GGUF type name.
    pub tensor_types: BTreeMap<String, usize>,
    pub tokenizer: String,
    pub tokenizer_pre: Option<String>,
    /// Fingerprint of the vocabulary and tokenization rules (runs with equal values produce
    /// equal ids for equal text).
    #[serde(default)]
    pub tokenizer_sha256: String,
    pub add_bos: bool,
    /// The hub repository and commit the model was read from (`--model hf:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<crate::hub::HubOrigin>,
}

/// Results written before `whole_text_tokenized` existed tokenized the whole text.
fn tokenized_whole_default() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DataInfo {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
    /// Tokens in the tokenized text (after `max_tokens`). When `--chunks` or `--max-tokens`
    /// needs only the beginning of a long text, only that beginning is tokenized:
    /// `whole_text_tokenized` is then false and this counts its tokens.
    pub stream_tokens: u64,
    #[serde(default = "tokenized_whole_default")]
    pub whole_text_tokenized: bool,
    /// Documents (`rolling` only).
    pub documents: Option<u64>,
    pub words: Option<u64>,
    /// The dataset the text was made from (`--data NAME`): its name, repository, commit and
    /// files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<crate::data::named::DataOrigin>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WindowRecord {
    pub index: usize,
    pub group: usize,
    pub start: usize,
    pub input_tokens: usize,
    pub tokens: u64,
    pub nll_sum: f64,
    /// Σ nll² over the window's tokens (for running error bands).
    #[serde(default)]
    pub nll_sum_sq: f64,
    /// The rank that scored the window.
    #[serde(default)]
    pub rank: usize,
    /// Seconds from the start of that rank's scoring to the end of the window's batch.
    #[serde(default)]
    pub finished_s: f64,
    #[serde(with = "crate::eval::accumulator::i128_string")]
    pub nll_sum_fixed: i128,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    pub load_s: f64,
    pub tokenize_s: f64,
    pub eval_s: f64,
    pub total_s: f64,
    /// Tokens through the model per second of evaluation.
    pub tokens_per_s: f64,
    /// Scored tokens per second of evaluation.
    pub scored_tokens_per_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SystemInfo {
    pub threads: usize,
    pub cpu_features: Vec<String>,
    pub peak_rss_bytes: Option<u64>,
    pub host: Option<String>,
    /// The instruction-set level our kernels ran at and how it was chosen (absent in files
    /// written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelIsa>,
}

/// The kernels' instruction-set level (`portable`, `avx2`, `avx512`): what CPUID advertised,
/// the `PPL_ISA` cap, the level used (the highest at most both that executed in a probe).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelIsa {
    pub isa: String,
    pub advertised: String,
    pub cap: Option<String>,
    /// False when an advertised, uncapped level trapped (or failed) in the probe.
    pub executes: bool,
    /// E.g. `avx512 (advertised: avx512, executes)`; at `amx`, where BF16 is multiplied
    /// (`; BF16 on the tiles` or `; BF16 on vdpbf16ps`).
    pub summary: String,
}

impl KernelIsa {
    /// This process's choice.
    pub fn detect() -> Self {
        let c = crate::model::kernels::isa_choice();
        KernelIsa {
            isa: c.used.name().to_string(),
            advertised: c.advertised.name().to_string(),
            cap: c.cap.map(|l| l.name().to_string()),
            executes: !c.failed_to_execute(),
            summary: crate::model::kernels::kernels_summary(),
        }
    }
}

impl Results {
    /// Writes JSON to a temporary file beside `path` and renames it into place, so a crash
    /// never leaves a partial file under the final name.
    /// Devices, FIFOs and `-` are written directly and symbolic links followed
    /// ([`crate::output`]).
    pub fn write_atomic(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::output::check(path, "--output", &[])
            .map_err(std::io::Error::other)?
            .write(&json)
    }

    /// Human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let err = self
            .ppl_err
            .map(|e| format!(" ± {e:.4}"))
            .unwrap_or_default();
        s += &format!("Final estimate: PPL = {:.4}{err}\n", self.ppl);
        for w in &self.warnings {
            s += &format!("WARNING: {w}\n");
        }
        if let Some([lo, hi]) = self.ci95 {
            s += &format!(
                "95% CI (block bootstrap over {} blocks): [{lo:.4}, {hi:.4}]\n",
                self.windows
                    .iter()
                    .map(|w| w.group)
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
            );
        }
        s += &format!(
            "scored tokens: {} in {} windows, mean NLL {:.6} nats\n",
            self.tokens,
            self.windows.len(),
            self.mean_nll
        );
        if let (Some(w), Some(b), Some(bpb)) = (
            self.word_perplexity,
            self.byte_perplexity,
            self.bits_per_byte,
        ) {
            // lm-evaluation-harness's metric names: the same definitions.
            s += &format!(
                "word_perplexity {w:.4}, byte_perplexity {b:.6}, bits_per_byte {bpb:.6}\n"
            );
            if let Some(task) = self.config.get("task").and_then(|t| t.get("name")) {
                let ctx = self.config.get("ctx").and_then(|c| c.as_u64()).unwrap_or(0);
                let origin = match self.config["task"].get("window").and_then(|w| w.as_str()) {
                    Some("model") => "the model's maximum length, as lm-eval uses",
                    _ => "set by --ctx; lm-eval's default is the model's maximum length",
                };
                let name = task.as_str().unwrap_or("?");
                s += &format!(
                    "task {name} (lm-evaluation-harness), window {ctx} tokens: {origin}\n"
                );
            }
        }
        let rss = self
            .system
            .peak_rss_bytes
            .map(|b| format!(", peak RSS {:.0} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or_default();
        let isa = self
            .system
            .kernels
            .as_ref()
            .map(|k| format!(", {} kernels", k.isa))
            .unwrap_or_default();
        let threads = match self.system.threads {
            1 => "1 thread".to_string(),
            n => format!("{n} threads"),
        };
        let all_from_ledger = self
            .run
            .as_ref()
            .is_some_and(|r| r.windows_from_ledger == self.windows.len());
        if all_from_ledger {
            s += &format!(
                "throughput: none measured (every window came from the run's ledger), total {:.2} s, {threads}{rss}\n",
                self.timings.total_s
            );
        } else {
            s += &format!(
                "throughput: {:.1} tokens/s through the model ({:.1} scored/s), eval {:.2} s, total {:.2} s, {threads}{rss}{isa}\n",
                self.timings.tokens_per_s,
                self.timings.scored_tokens_per_s,
                self.timings.eval_s,
                self.timings.total_s,
            );
        }
        if let Some(line) = self.mesh.as_ref().and_then(|m| {
            let through_model = self.windows.iter().map(|w| w.input_tokens as u64).sum();
            ring_summary(m, through_model)
        }) {
            s += &line;
        }
        s
    }
}

/// The context-parallel ring's line of the summary: what each rank sent, per token through
/// the model, and the ring's share of the ranks' working time (computing plus waiting in the
/// ring's sends and receives, i.e. what attention did not hide). `None` without a ring.
fn ring_summary(mesh: &MeshInfo, tokens_through_model: u64) -> Option<String> {
    let ranks = &mesh.ranks;
    let sent: u64 = ranks.iter().map(|r| r.ring_bytes_sent).sum();
    if mesh.dims.cp <= 1 || sent == 0 {
        return None;
    }
    let share = |ring: f64, compute: f64| {
        if ring + compute > 0.0 {
            100.0 * ring / (ring + compute)
        } else {
            0.0
        }
    };
    let ring_s: f64 = ranks.iter().map(|r| r.ring_s).sum();
    let compute_s: f64 = ranks.iter().map(|r| r.compute_s).sum();
    let (worst_rank, worst) = ranks
        .iter()
        .map(|r| (r.rank, share(r.ring_s, r.compute_s)))
        .fold((0, f64::NEG_INFINITY), |a, b| if b.1 > a.1 { b } else { a });
    let per_token = sent.checked_div(tokens_through_model).unwrap_or(0);
    Some(format!(
        "context-parallel ring (cp {}): {:.1} MiB sent per rank, {per_token} B per token through the model; ring {:.1}% of the ranks' time (compute + ring), at most {worst:.1}% (rank {worst_rank})\n",
        mesh.dims.cp,
        sent as f64 / ranks.len() as f64 / (1024.0 * 1024.0),
        share(ring_s, compute_s),
    ))
}
