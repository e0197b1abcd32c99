//! The `ppl` command line. Parsing happens in two phases, as in ripgrep: clap turns argv
//! into raw [`EvalArgs`], then [`EvalArgs::resolve`] applies defaults and produces the
//! validated [`EvalConfig`] the pipeline runs.

mod bench;
mod checks;
pub mod config;
pub mod inspect;
mod launch;
mod runs;
mod synth;
mod validate;
pub mod yaml_bounds;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use self::config::Config;
use clap::{Args, Parser, Subcommand};

use crate::comm::codec::CommDtype;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::{fetch, DeviceSpec, GgufFile, Precision, Quantize, Scheme};
use crate::parallel::mesh::{ParallelDims, RequestedDims};
use crate::parallel::schedule::Schedule;
use crate::pipeline::{self, EvalConfig, RunOptions};
use crate::report::compare::NamedRun;
use crate::report::progress::ProgressMode;
use crate::report::{self, Format};
use crate::tokenize::Tokenizer;

#[derive(Debug, Parser)]
#[command(
    name = "ppl",
    version,
    about = "Exact, fast perplexity evaluation of LLMs"
)]
pub struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evaluate the perplexity of a GGUF model on a text file.
    Eval(EvalArgs),
    /// Compare a model with a base on the same tokens: KL divergence, ΔPPL, same top token.
    // The evaluation flags that do nothing here are hidden (and refused if given).
    #[command(
        mut_arg("run_dir", |a| a.hide(true)),
        mut_arg("resume", |a| a.hide(true)),
        mut_arg("report", |a| a.hide(true)),
        mut_arg("expect", |a| a.hide(true)),
        mut_arg("print_chunks", |a| a.hide(true))
    )]
    Compare(CompareArgs),
    /// Write a float copy of a GGUF model (every matrix dequantized to f32, f16 or bf16).
    Export(ExportArgs),
    /// Write a GGUF model with its weights quantized as `ppl eval --quantize` does at load.
    Quantize(QuantizeArgs),
    /// What a GGUF model holds: architecture, parameters, tensor types, tokenizer, memory.
    Inspect(inspect::InspectArgs),
    /// The models in the cache, one line each.
    Models(inspect::ModelsArgs),
    /// Print the token ids of a text, as llama.cpp would produce them.
    Tokenize(TokenizeArgs),
    /// Download a test model (default: SmolLM2-135M-Instruct Q4_1) and print its path.
    FetchModel(FetchArgs),
    /// Measure tokens/s and peak RSS on the reference workload.
    Bench(bench::BenchArgs),
    /// Write a random-weight model of a real model's shape (its PPL means nothing; speed and
    /// memory are real).
    #[command(long_about = synth::LONG_ABOUT)]
    Synth(synth::SynthArgs),
    /// Start a multi-process run through mpirun (torchrun-style flags).
    Launch(launch::LaunchArgs),
    /// Render results.json files: an HTML report, or a summary/comparison (md, txt, json).
    Report(ReportArgs),
    /// Check a configuration before running it: a pass/warn/fail checklist (exit 1 on failure).
    Validate(validate::ValidateArgs),
    /// The run directories (ledgers of finished windows, for --resume), newest first.
    Runs(runs::RunsArgs),
    /// Configuration files: `ppl config show --config F [--set K=V]` prints the resolved one.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Print the resolved configuration (file, --set overrides, flags and defaults).
    Show(EvalArgs),
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// One results.json (a report) or several (a comparison against the first).
    #[arg(required = true)]
    results: Vec<PathBuf>,
    /// Output file [default: html next to the first input; other formats to stdout].
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Html)]
    format: Format,
}

#[derive(Debug, Args, Clone)]
pub struct EvalArgs {
    /// YAML configuration (flags given here win over it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key, e.g. --set evaluation.batch_size=8 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Model: a GGUF file, or a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// UTF-8 text file to evaluate on.
    #[arg(short = 'f', long)]
    data: Option<PathBuf>,
    /// The field of each JSON Lines record (`--data F.jsonl`) holding its text [default: text].
    #[arg(long, value_name = "NAME")]
    text_field: Option<String>,
    /// How the text is cut into windows [default: chunks].
    #[arg(long, value_enum)]
    method: Option<Method>,
    /// A benchmark task reproduced exactly: wikitext (lm-evaluation-harness; rolling windows
    /// of the model's maximum length unless --ctx is given).
    #[arg(long, value_enum)]
    task: Option<crate::task::Task>,
    /// Window length in tokens [default: 512].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    ctx: Option<usize>,
    /// Step between window starts for --method stride [default: ctx/2].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    stride: Option<usize>,
    /// Score at most N windows (chunks, stride) or N documents (rolling).
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    chunks: Option<usize>,
    /// Use only the first N tokens of the text (chunks, stride).
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    max_tokens: Option<usize>,
    /// Windows per forward pass [default: 1].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    batch_size: Option<usize>,
    /// Compute threads [default: all cores].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    threads: Option<usize>,
    /// native: quantized weights as stored; f32: weights dequantized to f32 [default: native].
    #[arg(long, value_enum)]
    precision: Option<Precision>,
    /// Where the model runs: cpu, cuda (each rank of a machine on its own GPU) or cuda:N
    /// (needs a build with `--features cuda`) [default: cpu].
    #[arg(long, value_name = "DEVICE")]
    device: Option<DeviceSpec>,
    /// Where tensor-parallel activations are summed: host (the rank communicator) or nccl
    /// (GPU to GPU; needs --device cuda and a build with `--features nccl`) [default: host].
    #[arg(long, value_enum, value_name = "BACKEND")]
    tp_backend: Option<TpBackend>,
    /// Seed of the bootstrap resampling; rank 0's value is used by every rank [default: 42].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<u64>)]
    seed: Option<u64>,
    /// Ranks of the local backend: threads sharing one copy of the weights [default: 1].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    ranks: Option<usize>,
    /// Data-parallel replicas, each holding a whole copy of the model (or of its shards).
    #[arg(long, value_name = "N")]
    dp_replicate: Option<i64>,
    /// FSDP degree: each rank of a shard group stores 1/N of every layer and gathers it just
    /// before use; -1 = the ranks left over by the other degrees.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    dp_shard: Option<i64>,
    /// Tensor-parallel degree: heads, MLP channels and vocabulary split across N ranks.
    #[arg(long, value_name = "N")]
    tp: Option<i64>,
    /// Pipeline-parallel degree: the layers split into N consecutive stages.
    #[arg(long, value_name = "N")]
    pp: Option<i64>,
    /// Context-parallel degree: each window's positions split across N ranks (ring
    /// attention); --ctx must be divisible by 2·N, --method chunks.
    #[arg(long, value_name = "N")]
    cp: Option<i64>,
    /// Quantize the weights at load: int4 (asymmetric groups, torchao-style), int8 (per
    /// channel), a GGUF type (q4_0, q4_1, q8_0, q4_k, q6_k) or llama.cpp's q4_k_m mix
    /// [default: none].
    #[arg(long, value_enum, value_name = "TYPE")]
    quantize: Option<Scheme>,
    /// Values per int4 group along a row [default: 128].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    group_size: Option<usize>,
    /// Weights --quantize leaves alone: embeddings, output, embeddings,output or none
    /// [default: embeddings].
    #[arg(long, value_name = "LIST")]
    quantize_skip: Option<String>,
    /// Activations between model-parallel ranks: f32 (exact) or compressed [default: f32].
    #[arg(long, value_enum)]
    comm_dtype: Option<CommDtype>,
    /// How windows are distributed over ranks [default: static].
    #[arg(long, value_enum)]
    schedule: Option<Schedule>,
    /// Communication backend [default: mpi when started by mpirun/srun, else local].
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// Testing aid: rank R reads PATH instead of --data (simulates a node with another file).
    #[arg(long, value_name = "R=PATH", hide = true)]
    debug_rank_data: Option<String>,
    /// Bootstrap replicates for the 95% confidence interval [default: 1000].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    bootstrap_samples: Option<usize>,
    /// Print llama.cpp-style running values [1]…,[2]… on stdout.
    #[arg(long)]
    print_chunks: bool,
    /// Run directory: the ledger of finished windows and the configuration go here
    /// [default: a fresh YYYYMMDD-HHMMSS under ~/.local/state/ppl/runs ($XDG_STATE_HOME,
    /// $PPL_STATE_DIR); `ppl runs` lists them].
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Resume the run in DIR: windows its ledgers hold are not recomputed. Without --config
    /// or --model, the configuration saved in DIR/config.yaml is used (flags still override,
    /// e.g. another --ranks or mesh).
    #[arg(long, value_name = "DIR", conflicts_with = "run_dir")]
    resume: Option<PathBuf>,
    /// Write results as JSON to this file (written only when the run completes).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Progress display on stderr.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Also write the HTML report [default path: --output with .html, else report.html].
    #[arg(long, num_args = 0..=1, value_name = "PATH")]
    report: Option<Option<PathBuf>>,
    /// Compare with a previous results.json: explain a difference larger than its 95% CI
    /// (and exit 1).
    #[arg(long, value_name = "RESULTS.json")]
    expect: Option<PathBuf>,
    /// No progress and no summary (the JSON file still gets written).
    #[arg(short, long)]
    quiet: bool,
    /// Allow more local ranks than 4 per core (each rank keeps its own tokenizer, text and
    /// windows).
    #[arg(long)]
    oversubscribe: bool,
}

/// Communication backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Ranks are threads of this process.
    Local,
    /// One rank per MPI process (build with `--features mpi`, start with mpirun or srun).
    Mpi,
}

/// Whether this process was started by an MPI launcher.
impl EvalArgs {
    fn backend(&self) -> Backend {
        self.backend
            .unwrap_or(if crate::comm::launcher::under_launcher() {
                Backend::Mpi
            } else {
                Backend::Local
            })
    }

    /// `ppl compare` shares the evaluation flags, but keeps no ledger and writes no report:
    /// these flags would do nothing there, so they are refused rather than ignored.
    fn refuse_eval_only_flags(&self) -> anyhow::Result<()> {
        let given = [
            ("--run-dir", self.run_dir.is_some()),
            ("--resume", self.resume.is_some()),
            ("--report", self.report.is_some()),
            ("--expect", self.expect.is_some()),
            ("--print-chunks", self.print_chunks),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            bail!(
                "{flag} applies to `ppl eval`, not to `ppl compare` (which keeps no ledger and writes its comparison with -o/--output); drop {flag}"
            );
        }
        Ok(())
    }

    fn run_options(&self) -> anyhow::Result<RunOptions> {
        let rank_data = match &self.debug_rank_data {
            None => None,
            Some(s) => {
                let (r, p) = s.split_once('=').ok_or_else(|| {
                    anyhow::anyhow!("--debug-rank-data takes RANK=PATH, got '{s}'")
                })?;
                let r: usize = r
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--debug-rank-data: '{r}' is not a rank"))?;
                Some((r, PathBuf::from(p)))
            }
        };
        Ok(RunOptions {
            progress: Some(if self.quiet {
                ProgressMode::None
            } else {
                self.progress
            }),
            print_chunks: self.print_chunks,
            rank_data,
            config_yaml: None,
            oversubscribe: self.oversubscribe,
        })
    }

    fn load_config(&self) -> anyhow::Result<Config> {
        let saved = self
            .resume
            .as_ref()
            .filter(|_| self.config.is_none() && self.model.is_none())
            .map(|d| d.join("config.yaml"));
        if let Some(p) = &saved {
            let dir = p.parent().unwrap_or(p);
            if !dir.is_dir() {
                bail!(
                    "--resume {}: no such directory; give the run directory of an earlier run (printed when it started, e.g. runs/20250101-120000), or start a new run without --resume",
                    dir.display()
                );
            }
            if !p.is_file() {
                bail!(
                    "--resume {}: no config.yaml there; give the run's flags again (--model, --data, …) with --resume, or check the directory",
                    p.parent().map_or(String::new(), |d| d.display().to_string())
                );
            }
        }
        Ok(match self.config.as_ref().or(saved.as_ref()) {
            Some(p) => Config::load(p, &self.sets)?,
            None if !self.sets.is_empty() => {
                Config::parse("", "--set", &self.sets, &|v| std::env::var(v).ok())?
            }
            None => Config::default(),
        })
    }

    /// Phase two: merges flags (which win), `--set`, the config file and defaults, and checks
    /// what can be checked without opening any file.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let c = self.load_config()?;
        let uint = |k: &str| c.int(k).filter(|&i| i >= 0).map(|i| i as usize);
        let scheme = match (self.quantize, c.str("evaluation.quantizer.type")) {
            (Some(s), _) => Some(s),
            (None, None | Some("none")) => None,
            (None, Some("int4_weight_only")) => Some(Scheme::Int4),
            (None, Some("int8_weight_only")) => Some(Scheme::Int8),
            (None, Some(t)) => {
                Some(<Scheme as clap::ValueEnum>::from_str(t, true).map_err(|_| {
                    anyhow::anyhow!("evaluation.quantizer.type = {t}: not a quantization type")
                })?)
            }
        };
        let skip = self
            .quantize_skip
            .clone()
            .or_else(|| c.str("evaluation.quantizer.skip").map(str::to_string))
            .unwrap_or_else(|| "embeddings".into());
        let (skip_embeddings, skip_output) = parse_skip(&skip)?;
        let group_size = self
            .group_size
            .or(uint("evaluation.quantizer.groupsize"))
            .unwrap_or(128);
        if group_size == 0 {
            bail!("--group-size must be at least 1");
        }
        let quantize = scheme.map(|scheme| Quantize {
            scheme,
            group_size,
            embeddings: !skip_embeddings,
            output: !skip_output,
        });
        let precision = match (self.precision, c.str("evaluation.precision")) {
            (Some(p), _) => p,
            (None, Some("f32")) => Precision::F32,
            (None, Some("bf16")) => Precision::Bf16,
            (None, Some("f16")) => Precision::F16,
            (None, Some("native")) | (None, None) => Precision::Native,
            (None, Some(p)) => bail!("evaluation.precision = {p}: use native, f32, bf16 or f16"),
        };
        let device = match (self.device, c.str("evaluation.device")) {
            (Some(d), _) => d,
            (None, Some(s)) => s
                .parse()
                .map_err(|e| anyhow::anyhow!("evaluation.device = {s}: {e}"))?,
            (None, None) => DeviceSpec::Cpu,
        };
        let tp_backend = match (self.tp_backend, c.str("parallel.tp_backend")) {
            (Some(b), _) => b,
            (None, Some("nccl")) => TpBackend::Nccl,
            (None, Some("host")) | (None, None) => TpBackend::Host,
            (None, Some(s)) => bail!("parallel.tp_backend = {s}: use host or nccl"),
        };
        let parallel = RequestedDims {
            dp_replicate: self.dp_replicate.or(c.int("parallel.dp_replicate")),
            dp_shard: self.dp_shard.or(c.int("parallel.dp_shard")),
            tp: self.tp.or(c.int("parallel.tp")),
            cp: self.cp.or(c.int("parallel.cp")),
            pp: self.pp.or(c.int("parallel.pp")),
        };
        // Degrees of 1 everywhere ask for nothing: plain data parallelism.
        let parallel = if [
            parallel.dp_replicate,
            parallel.dp_shard,
            parallel.tp,
            parallel.cp,
            parallel.pp,
        ]
        .iter()
        .all(|d| d.is_none() || *d == Some(1))
        {
            RequestedDims::default()
        } else {
            parallel
        };
        let dp = parallel.product();
        let ranks = self.ranks.or(dp).unwrap_or(1);
        // Check the degrees now when the world is known (local), so the error comes first.
        if parallel.any() && self.backend() == Backend::Local {
            ParallelDims::resolve(&parallel, ranks)?;
        }
        let comm_dtype = match (self.comm_dtype, c.str("parallel.comm_dtype")) {
            (Some(d), _) => d,
            (None, None) => CommDtype::F32,
            (None, Some(s)) => <CommDtype as clap::ValueEnum>::from_str(s, true).map_err(|_| {
                anyhow::anyhow!("parallel.comm_dtype = {s}: use f32, bf16, f16 or int8")
            })?,
        };
        if ranks == 0 {
            bail!("--ranks must be at least 1");
        }
        let method = self
            .method
            .or_else(|| {
                c.str("data.method").map(|m| match m {
                    "stride" => Method::Stride,
                    "rolling" => Method::Rolling,
                    _ => Method::Chunks,
                })
            })
            .unwrap_or(Method::Chunks);
        let task = match (self.task, c.str("task")) {
            (Some(t), _) => Some(t),
            (None, None) => None,
            (None, Some(t)) => Some(
                <crate::task::Task as clap::ValueEnum>::from_str(t, true)
                    .map_err(|_| anyhow::anyhow!("task = {t}: the tasks are: wikitext"))?,
            ),
        };
        let ctx = self.ctx.or(uint("evaluation.max_seq_len"));
        let (method, ctx, task) = match task {
            None => (method, ctx.unwrap_or(512), None),
            Some(t) => {
                let method_given = self.method.is_some() || c.str("data.method").is_some();
                let model = self.model.clone().or_else(|| c.path("model.path"));
                crate::task::resolve_window(t, method, method_given, ctx, model.as_deref())?
            }
        };
        let threads = match self.threads.or(uint("evaluation.threads")) {
            Some(0) => bail!("--threads must be at least 1"),
            Some(n) => crate::preflight::cap_threads(n),
            None if self.backend() == Backend::Mpi => default_threads_under_mpi(),
            None => default_threads(),
        };
        let stride = match (method, self.stride.or(uint("data.stride"))) {
            (Method::Stride, Some(s)) => s,
            (Method::Stride, None) => (ctx / 2).max(1),
            (_, Some(_)) => bail!("--stride (data.stride) applies only to --method stride"),
            (_, None) => 0,
        };
        let max_tokens = self.max_tokens.or(uint("data.max_tokens"));
        if max_tokens.is_some() && method == Method::Rolling {
            bail!("--max-tokens applies to --method chunks and stride; use --chunks to limit documents");
        }
        let (Some(model), Some(data)) = (
            self.model.clone().or_else(|| c.path("model.path")),
            self.data.clone().or_else(|| c.path("data.path")),
        ) else {
            bail!("give the model and the data: --model M.gguf --data text.txt (or model.path / data.path in --config)");
        };
        check_model_format(c.str("model.format"), &model)?;
        let schedule = self
            .schedule
            .or_else(|| {
                c.str("evaluation.schedule").map(|s| {
                    if s == "dynamic" {
                        Schedule::Dynamic
                    } else {
                        Schedule::Static
                    }
                })
            })
            .unwrap_or(Schedule::Static);
        let output = self
            .output
            .clone()
            .or_else(|| c.path("output.dir").map(|d| d.join("results.json")));
        let report = self
            .report
            .clone()
            .or_else(|| (c.bool("output.report") == Some(true)).then_some(None));
        Ok(Resolved {
            eval: EvalConfig {
                model,
                data,
                method,
                ctx,
                stride,
                chunks: self.chunks.or(uint("data.chunks")),
                max_tokens,
                text_field: self
                    .text_field
                    .clone()
                    .or_else(|| c.str("data.text_field").map(str::to_string))
                    .unwrap_or_else(|| "text".into()),
                batch_size: self
                    .batch_size
                    .or(uint("evaluation.batch_size"))
                    .unwrap_or(1),
                threads,
                precision,
                device,
                seed: self
                    .seed
                    .or(uint("evaluation.seed").map(|s| s as u64))
                    .unwrap_or(42),
                bootstrap_samples: self
                    .bootstrap_samples
                    .or(uint("evaluation.bootstrap_samples"))
                    .unwrap_or(1000),
                ranks,
                schedule,
                parallel,
                comm_dtype,
                tp_backend,
                quantize,
                run_dir: self
                    .resume
                    .clone()
                    .or_else(|| self.run_dir.clone())
                    .or_else(|| c.path("output.run_dir")),
                resume: self.resume.is_some(),
                task,
            },
            ranks_given: self.ranks.is_some() || dp.is_some(),
            output,
            report,
        })
    }
}

/// `model.format` (a config file's statement of what `model.path` is) against the path:
/// `gguf` is a file, `safetensors` a Hugging Face checkpoint directory.
fn check_model_format(format: Option<&str>, model: &Path) -> anyhow::Result<()> {
    let Some(format) = format else {
        return Ok(());
    };
    let is_dir = model.is_dir();
    if model.exists() && is_dir != (format == "safetensors") {
        bail!(
            "model.format = {format}, but model.path {} is {}: use format: {}",
            model.display(),
            if is_dir {
                "a directory (a Hugging Face checkpoint)"
            } else {
                "a file"
            },
            if is_dir { "safetensors" } else { "gguf" }
        );
    }
    Ok(())
}

/// Everything `ppl eval` runs with, after phase two.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub eval: EvalConfig,
    /// Whether the rank count was asked for (so that MPI can check it against its world).
    pub ranks_given: bool,
    pub output: Option<PathBuf>,
    pub report: Option<Option<PathBuf>>,
}

impl Resolved {
    /// [`Self::to_yaml`] with absolute model and data paths (saved in the run directory, where
    /// relative paths would resolve against the wrong place).
    pub fn to_yaml_absolute(&self) -> String {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let mut r = self.clone();
        r.eval.model = abs(&r.eval.model);
        r.eval.data = abs(&r.eval.data);
        r.output = r.output.as_ref().map(abs);
        r.yaml(false)
    }

    /// The resolved configuration in the config file's schema (`ppl config show`).
    pub fn to_yaml(&self) -> String {
        self.yaml(true)
    }

    /// `keep_world`: write a plain data-parallel rank count as `dp_replicate` (`config show`);
    /// otherwise leave the world to the next run (a resume may use any world size).
    fn yaml(&self, keep_world: bool) -> String {
        let e = &self.eval;
        let mut out = format!(
            "model:\n  path: {}\n  format: {}\ndata:\n  path: {}\n  method: {}\n",
            e.model.display(),
            if e.model.is_dir() {
                "safetensors"
            } else {
                "gguf"
            },
            e.data.display(),
            e.method
        );
        if e.text_field != "text" {
            out += &format!(
                "  text_field: {}\n",
                serde_json::to_string(&e.text_field).expect("strings serialize")
            );
        }
        if e.method == Method::Stride {
            out += &format!("  stride: {}\n", e.stride);
        }
        out += &format!("  chunks: {}\n", e.chunks.map_or(-1, |c| c as i64));
        if let Some(m) = e.max_tokens {
            out += &format!("  max_tokens: {m}\n");
        }
        let p = &e.parallel;
        let deg = |d: Option<i64>| d.unwrap_or(1);
        out += &format!(
            "parallel:\n  dp_replicate: {}\n  dp_shard: {}\n  tp: {}\n  cp: {}\n  pp: {}\n  comm_dtype: {}\n  tp_backend: {}\nevaluation:\n  batch_size: {}\n  max_seq_len: {}\n  precision: {}\n  device: {}\n  threads: {}\n  schedule: {}\n  seed: {}\n  bootstrap_samples: {}\n",
            if p.any() {
                deg(p.dp_replicate)
            } else if keep_world {
                e.ranks as i64
            } else {
                1
            },
            if p.any() { p.dp_shard.unwrap_or(-1) } else { 1 },
            deg(p.tp),
            deg(p.cp),
            deg(p.pp),
            e.comm_dtype,
            e.tp_backend,
            e.batch_size, e.ctx, e.precision, e.device, e.threads, e.schedule, e.seed, e.bootstrap_samples
        );
        if let Some(t) = e.task {
            // The model's own length is found again on the next run (not pinned as --ctx).
            if t.window == crate::task::WindowSource::Model {
                out = out.replace(&format!("  max_seq_len: {}\n", e.ctx), "");
            }
            out = format!("task: {}\n{out}", t.name);
        }
        if let Some(q) = &e.quantize {
            let kind = match q.scheme {
                Scheme::Int4 => "int4_weight_only".to_string(),
                Scheme::Int8 => "int8_weight_only".to_string(),
                s => s.to_string(),
            };
            let skip = match (q.embeddings, q.output) {
                (true, true) => "none",
                (false, true) => "embeddings",
                (true, false) => "output",
                (false, false) => "embeddings,output",
            };
            out += &format!(
                "  quantizer:\n    type: {kind}\n    groupsize: {}\n    skip: {skip}\n",
                q.group_size
            );
        }
        if self.output.is_some() || (keep_world && e.run_dir.is_some()) {
            out += "output:\n";
        }
        if let Some(o) = &self.output {
            out += &format!(
                "  dir: {}\n  report: {}\n",
                o.parent().map_or(".".into(), |p| p.display().to_string()),
                self.report.is_some()
            );
        }
        // A saved configuration lives in its run directory: `--resume` names it.
        if let Some(d) = e.run_dir.as_ref().filter(|_| keep_world) {
            out += &format!("  run_dir: {}\n", d.display());
        }
        out
    }
}

#[derive(Debug, Args)]
struct CompareArgs {
    /// The base model (GGUF) the model is compared with.
    #[arg(
        long,
        value_name = "BASE.gguf",
        required_unless_present = "base_logits"
    )]
    base: Option<PathBuf>,
    /// How the base's weights are used [default: f32: the exact values as stored].
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    base_precision: Precision,
    /// Also store what later comparisons need of the base in FILE: its final hidden state per
    /// scored token (f32, hidden-size values: 43× smaller than llama.cpp's 16-bit logits for
    /// SmolLM2).
    #[arg(long, value_name = "FILE", requires = "base")]
    save_base: Option<PathBuf>,
    /// Take the base from FILE (written by --save-base): only the base's output layer is
    /// loaded (from --base, default the GGUF the file names) and its logits are recomputed
    /// from the stored rows, bit for bit the ones of the whole base.
    #[arg(long, value_name = "FILE", conflicts_with = "save_base")]
    base_logits: Option<PathBuf>,
    /// The model (--model, with --precision and --quantize) and the evaluation options.
    #[command(flatten)]
    eval: EvalArgs,
}

/// Float types `ppl export` writes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FloatType {
    F32,
    F16,
    Bf16,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// Model to read: a GGUF file (any type ppl loads) or, for `--format safetensors`, a
    /// Hugging Face checkpoint directory.
    model: PathBuf,
    /// Float type of the written matrices (in GGUF, norms stay f32).
    #[arg(long, value_enum)]
    dtype: FloatType,
    /// `gguf`: one GGUF file. `safetensors`: a Hugging Face checkpoint directory
    /// (config.json, safetensors shards, tokenizer.json) that transformers and ppl read.
    #[arg(long, value_enum, default_value = "gguf")]
    format: ExportFormat,
    /// Largest safetensors shard, in MiB (larger checkpoints are split, with an index).
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    shard_size: u64,
    /// Output GGUF file, or checkpoint directory (new or empty).
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum ExportFormat {
    Gguf,
    Safetensors,
}

#[derive(Debug, Args)]
struct QuantizeArgs {
    /// GGUF model to read (its weights are dequantized to f32 first).
    input: PathBuf,
    /// Output GGUF file.
    output: PathBuf,
    /// GGUF type of the linear layers (K-quants fall back to Q5_0 / Q8_0 for rows that are not
    /// a multiple of 256, as llama.cpp's quantizer does).
    #[arg(long = "type", value_enum, value_name = "TYPE")]
    scheme: Scheme,
    /// Weights left as stored: embeddings, output, embeddings,output or none [default:
    /// embeddings]. A tied embedding table follows the output layer's choice.
    #[arg(long, value_name = "LIST", default_value = "embeddings")]
    quantize_skip: String,
}

#[derive(Debug, Args)]
struct TokenizeArgs {
    /// Model whose tokenizer to use (GGUF file or checkpoint directory).
    #[arg(short, long)]
    model: PathBuf,
    /// Text to tokenize (else --file).
    #[arg(long, conflicts_with = "file")]
    text: Option<String>,
    /// File to tokenize.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct FetchArgs {
    /// Which model: smollm2 (the reference Llama model) or gemma3 (Gemma 3 270M Q4_K_M).
    #[arg(default_value = "smollm2")]
    name: String,
    /// Cache directory [default: $PPL_CACHE_DIR, $XDG_CACHE_HOME/ppl or ~/.cache/ppl].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

/// `--quantize-skip LIST`: whether the embeddings and the output layer are left alone.
fn parse_skip(list: &str) -> anyhow::Result<(bool, bool)> {
    let (mut embeddings, mut output) = (false, false);
    for part in list.split(',').map(str::trim) {
        match part {
            "none" | "" => {}
            "embeddings" => embeddings = true,
            "output" => output = true,
            other => bail!(
                "--quantize-skip {other}: use embeddings, output, both (embeddings,output) or none"
            ),
        }
    }
    Ok((embeddings, output))
}

/// Prints what `ppl export` / `ppl quantize` wrote: tensors per type and the size.
fn print_written(out: &std::path::Path, w: &crate::model::gguf_write::Written, src_bytes: u64) {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, t) in &w.types {
        *counts.entry(format!("{t:?}")).or_default() += 1;
    }
    let types: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "wrote {}: {} tensors ({}), {:.1} MiB (input {:.1} MiB)",
        out.display(),
        w.tensors,
        types.join(", "),
        w.bytes as f64 / (1u64 << 20) as f64,
        src_bytes as f64 / (1u64 << 20) as f64
    );
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Under an MPI launcher, ranks on one node share its cores: cores / local ranks.
fn default_threads_under_mpi() -> usize {
    (default_threads() / crate::comm::launcher::ranks_on_this_node()).max(1)
}

/// Pins the compute thread count: candle's matmul pools read these variables once, on first
/// use, so they are set before any tensor exists; our own parallel loops use rayon's pool.
fn configure_threads(n: usize) {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(checks::stderr_colour())
        .without_time()
        .try_init();
}

/// Entry point: runs the command and maps errors to a message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    // The kernels' instruction-set probe forks a child: done first, while the process is small,
    // has one thread and no MPI state (some MPI transports object to a fork after their start).
    crate::model::kernels::isa_choice();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", checks::error_message(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Eval(args) => {
            let mut resolved = args.resolve()?;
            let outputs = checks::EvalOutputs::plan(
                &resolved,
                args.config.as_deref(),
                args.expect.as_deref(),
            )?;
            let _spool = checks::stdin_to_file(&mut resolved.eval, args.backend())?;
            let cfg = &resolved.eval;
            let mut opts = args.run_options()?;
            opts.config_yaml = Some(resolved.to_yaml_absolute());
            let expected = match &args.expect {
                Some(p) => Some(report::load(p).map_err(|e| anyhow::anyhow!("--expect: {e}"))?),
                None => None,
            };
            let results = match args.backend() {
                Backend::Local => {
                    configure_threads(pipeline::threads_per_rank(cfg.threads, cfg.ranks));
                    pipeline::evaluate(cfg, &opts)?
                }
                Backend::Mpi => {
                    configure_threads(cfg.threads);
                    let expected = resolved.ranks_given.then_some(cfg.ranks);
                    match run_mpi(cfg, &opts, expected)? {
                        Some(r) => r,
                        None => return Ok(ExitCode::SUCCESS),
                    }
                }
            };
            outputs.write(&results)?;
            if outputs.results_on_stdout() && !args.quiet {
                eprint!("{}", results.summary());
            } else if !args.quiet {
                print!("{}", results.summary());
            } else {
                for w in &results.warnings {
                    eprintln!("warning: {w}");
                }
            }
            if let Some(prev) = &expected {
                let verdict = report::compare::expectation(prev, &results);
                if !verdict.ok {
                    bail!("--expect: {}", verdict.message);
                }
                eprintln!("--expect: {}", verdict.message);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compare(args) => {
            args.eval.refuse_eval_only_flags()?;
            let mut resolved = args.eval.resolve()?;
            let out = resolved
                .output
                .as_ref()
                .map(|o| {
                    let e = &resolved.eval;
                    crate::output::check(
                        o,
                        "--output",
                        &[("--model", &e.model), ("--data", &e.data)],
                    )
                })
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let _spool = checks::stdin_to_file(&mut resolved.eval, args.eval.backend())?;
            let cfg = &resolved.eval;
            if cfg.parallel.any() {
                bail!("ppl compare splits windows over ranks (data parallel) only; drop --tp/--pp/--dp-shard/--dp-replicate/--cp");
            }
            let opts = crate::compare::CompareOptions {
                base: match (&args.base, &args.base_logits) {
                    (gguf, Some(f)) => crate::compare::BaseSource::File {
                        path: f.clone(),
                        gguf: gguf.clone(),
                    },
                    (Some(b), None) => crate::compare::BaseSource::Model {
                        path: b.clone(),
                        precision: args.base_precision,
                    },
                    (None, None) => {
                        bail!("give the base with --base BASE.gguf or --base-logits FILE")
                    }
                },
                save_base: args.save_base.clone(),
            };
            let r = match args.eval.backend() {
                Backend::Local => {
                    crate::preflight::check_local_ranks(cfg.ranks, args.eval.oversubscribe)
                        .map_err(anyhow::Error::msg)?;
                    configure_threads(pipeline::threads_per_rank(cfg.threads, cfg.ranks));
                    crate::compare::compare(cfg, &opts)?
                }
                Backend::Mpi => {
                    configure_threads(cfg.threads);
                    let (comm, _) = mpi_comm()?;
                    if resolved.ranks_given && cfg.ranks != comm.size() {
                        bail!(
                            "--ranks {} but mpirun started {}; make them agree",
                            cfg.ranks,
                            comm.size()
                        );
                    }
                    match crate::compare::compare_rank(comm.as_ref(), cfg, &opts)? {
                        Some(r) => r,
                        None => return Ok(ExitCode::SUCCESS),
                    }
                }
            };
            if let Some(out) = &out {
                out.write(&serde_json::to_vec_pretty(&r)?)
                    .with_context(|| format!("cannot write {} (--output)", out.display()))?;
            }
            if !args.eval.quiet {
                print!("{}", crate::compare::render_text(&r));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tokenize(args) => {
            let g = GgufFile::open(&args.model)?;
            let tok = Tokenizer::from_gguf(&g)?;
            let text = match (&args.text, &args.file) {
                (Some(t), _) => t.clone(),
                (None, Some(f)) => crate::data::read_text(f)?,
                (None, None) => anyhow::bail!("give the text with --text or --file"),
            };
            let ids = tok.encode(&text)?;
            let line: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
            println!("{}", line.join(" "));
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(args) => {
            use candle_core::quantized::GgmlDType;
            let g = GgufFile::open(&args.model)?;
            let dtype = match args.dtype {
                FloatType::F32 => GgmlDType::F32,
                FloatType::F16 => GgmlDType::F16,
                FloatType::Bf16 => GgmlDType::BF16,
            };
            let w = match args.format {
                ExportFormat::Gguf => crate::model::gguf_write::write(
                    &g,
                    &args.output,
                    &crate::model::gguf_write::Conversion::Float(dtype),
                )?,
                ExportFormat::Safetensors => {
                    if args.shard_size == 0 {
                        anyhow::bail!("--shard-size 0: give the largest shard in MiB (e.g. 4096)");
                    }
                    let tok = Tokenizer::from_gguf(&g)?;
                    crate::model::hf_write::write(
                        &g,
                        &tok,
                        &args.output,
                        dtype,
                        args.shard_size << 20,
                    )?
                }
            };
            print_written(&args.output, &w, g.file_bytes());
            Ok(ExitCode::SUCCESS)
        }
        Command::Quantize(args) => {
            let g = GgufFile::open(&args.input)?;
            let (skip_embeddings, skip_output) = parse_skip(&args.quantize_skip)?;
            let q = Quantize {
                scheme: args.scheme,
                group_size: 32,
                embeddings: !skip_embeddings,
                output: !skip_output,
            };
            let w = crate::model::gguf_write::write(
                &g,
                &args.output,
                &crate::model::gguf_write::Conversion::Quantize(q),
            )?;
            print_written(&args.output, &w, g.file_bytes());
            Ok(ExitCode::SUCCESS)
        }
        Command::FetchModel(args) => {
            let dir = args.cache_dir.unwrap_or_else(fetch::cache_dir);
            let path = fetch::fetch(&dir, &fetch::by_name(&args.name)?)?;
            println!("{}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Inspect(args) => inspect::run_inspect(args),
        Command::Models(args) => inspect::run_models(args),
        Command::Launch(args) => launch::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Runs(args) => runs::run(args),
        Command::Config {
            action: ConfigAction::Show(args),
        } => {
            print!("{}", args.resolve()?.to_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(args) => {
            let inputs: Vec<(&str, &std::path::Path)> = args
                .results
                .iter()
                .map(|p| ("the results", p.as_path()))
                .collect();
            let target = match (&args.output, args.format) {
                (Some(o), _) => Some(o.clone()),
                (None, Format::Html) => Some(args.results[0].with_extension("html")),
                (None, _) => None,
            }
            .map(|o| crate::output::check(&o, "--output", &inputs))
            .transpose()
            .map_err(anyhow::Error::msg)?;
            let runs = args
                .results
                .iter()
                .map(|p| {
                    Ok(NamedRun {
                        name: p.display().to_string(),
                        results: report::load(p).map_err(anyhow::Error::msg)?,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let text = report::render(args.format, &runs);
            match target {
                Some(o) => {
                    o.write(text.as_bytes())
                        .with_context(|| format!("cannot write {} (--output)", o.display()))?;
                    eprintln!("wrote {}", o.display());
                }
                None => print!("{text}"),
            }
            for w in report::compare::compare(&runs)
                .iter()
                .filter_map(|r| r.warning.as_ref())
            {
                eprintln!("warning: {w}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(
    cfg: &EvalConfig,
    opts: &RunOptions,
    expected_world: Option<usize>,
) -> anyhow::Result<Option<crate::report::Results>> {
    let comm = crate::comm::mpi::MpiComm::init()?;
    let world = crate::comm::Communicator::size(&comm);
    if let Some(n) = expected_world.filter(|&n| n != world) {
        bail!("the configuration asks for {n} ranks (--ranks, or the product of the parallel degrees dp_replicate × dp_shard × tp × cp × pp) but mpirun started {world}; make them agree (--dp-shard -1 / dp_shard: -1 infers the rest)");
    }
    let mut opts = opts.clone();
    if crate::comm::Communicator::rank(&comm) != 0 {
        opts.progress = Some(ProgressMode::None);
        opts.print_chunks = false;
    }
    Ok(pipeline::evaluate_rank(&comm, cfg, &opts)?)
}

/// This process's MPI communicator and the library's version.
#[cfg(feature = "mpi")]
fn mpi_comm() -> anyhow::Result<(Box<dyn crate::comm::Communicator>, String)> {
    let comm = crate::comm::mpi::MpiComm::init()?;
    let version = crate::comm::mpi::MpiComm::library_version();
    let first_line = version
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok((Box::new(comm), first_line))
}

#[cfg(not(feature = "mpi"))]
fn mpi_comm() -> anyhow::Result<(Box<dyn crate::comm::Communicator>, String)> {
    bail!("this ppl was built without MPI support; rebuild with `cargo build --release --features mpi`")
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(
    _: &EvalConfig,
    _: &RunOptions,
    _: Option<usize>,
) -> anyhow::Result<Option<crate::report::Results>> {
    anyhow::bail!(
        "this ppl was built without MPI support; rebuild with `cargo build --release --features mpi` \
         (needs an MPI library: apt-get install libopenmpi-dev openmpi-bin), or pass --backend local"
    )
}
