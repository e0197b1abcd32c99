//! `ppl eval`'s flags ([`EvalArgs`]) and their resolution, layered over a config file and
//! `--set`, into the validated [`Resolved`] configuration.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::checks;
use super::config::Config;
use clap::Args;

use crate::comm::codec::CommDtype;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::{DeviceSpec, Precision, Quantize, Scheme};
use crate::parallel::mesh::{ParallelDims, RequestedDims};
use crate::parallel::schedule::Schedule;
use crate::report::progress::ProgressMode;
use crate::run::{EvalConfig, RunOptions};

#[derive(Debug, Args, Clone)]
pub struct EvalArgs {
    /// YAML configuration (flags given here win over it).
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    /// Override a configuration key, e.g. --set evaluation.batch_size=8 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(super) sets: Vec<String>,
    /// Model: a GGUF file, or a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json).
    #[arg(short, long)]
    pub(super) model: Option<PathBuf>,
    /// UTF-8 text file to evaluate on.
    #[arg(short = 'f', long)]
    pub(super) data: Option<PathBuf>,
    /// The field of each JSON Lines record (`--data F.jsonl`) holding its text [default: text].
    #[arg(long, value_name = "NAME")]
    pub(super) text_field: Option<String>,
    /// How the text is cut into windows [default: chunks].
    #[arg(long, value_enum)]
    pub(super) method: Option<Method>,
    /// A benchmark task reproduced exactly: wikitext (lm-evaluation-harness; rolling windows
    /// of the model's maximum length unless --ctx is given).
    #[arg(long, value_enum)]
    pub(super) task: Option<crate::task::Task>,
    /// Window length in tokens [default: 512].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) ctx: Option<usize>,
    /// Step between window starts for --method stride [default: ctx/2].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) stride: Option<usize>,
    /// Score at most N windows (chunks, stride) or N documents (rolling).
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) chunks: Option<usize>,
    /// Use only the first N tokens of the text (chunks, stride).
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) max_tokens: Option<usize>,
    /// Windows per forward pass [default: 1].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) batch_size: Option<usize>,
    /// Compute threads [default: all cores].
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) threads: Option<usize>,
    /// native: quantized weights as stored; f32: weights dequantized to f32 [default: native].
    #[arg(long, value_enum)]
    pub(super) precision: Option<Precision>,
    /// Where the model runs: cpu, cuda (each rank of a machine on its own GPU) or cuda:N
    /// (needs a build with `--features cuda`) [default: cpu].
    #[arg(long, value_name = "DEVICE")]
    pub(super) device: Option<DeviceSpec>,
    /// Where tensor-parallel activations are summed: host (the rank communicator) or nccl
    /// (GPU to GPU; needs --device cuda and a build with `--features nccl`) [default: host].
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub(super) tp_backend: Option<TpBackend>,
    /// Seed of the bootstrap resampling; rank 0's value is used by every rank [default: 42].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<u64>)]
    pub(super) seed: Option<u64>,
    /// Ranks of the local backend: threads sharing one copy of the weights [default: 1].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) ranks: Option<usize>,
    /// Data-parallel replicas, each holding a whole copy of the model (or of its shards).
    #[arg(long, value_name = "N")]
    pub(super) dp_replicate: Option<i64>,
    /// FSDP degree: each rank of a shard group stores 1/N of every layer and gathers it just
    /// before use; -1 = the ranks left over by the other degrees.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub(super) dp_shard: Option<i64>,
    /// Tensor-parallel degree: heads, MLP channels and vocabulary split across N ranks.
    #[arg(long, value_name = "N")]
    pub(super) tp: Option<i64>,
    /// Pipeline-parallel degree: the layers split into N consecutive stages.
    #[arg(long, value_name = "N")]
    pub(super) pp: Option<i64>,
    /// Context-parallel degree: each window's positions split across N ranks (ring
    /// attention); --ctx must be divisible by 2·N, --method chunks.
    #[arg(long, value_name = "N")]
    pub(super) cp: Option<i64>,
    /// Quantize the weights at load: int4 (asymmetric groups, torchao-style), int8 (per
    /// channel), a GGUF type (q4_0, q4_1, q8_0, q4_k, q6_k) or llama.cpp's q4_k_m mix
    /// [default: none].
    #[arg(long, value_enum, value_name = "TYPE")]
    pub(super) quantize: Option<Scheme>,
    /// Values per int4 group along a row [default: 128].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) group_size: Option<usize>,
    /// Weights --quantize leaves alone: embeddings, output, embeddings,output or none
    /// [default: embeddings].
    #[arg(long, value_name = "LIST")]
    pub(super) quantize_skip: Option<String>,
    /// Activations between model-parallel ranks: f32 (exact) or compressed [default: f32].
    #[arg(long, value_enum)]
    pub(super) comm_dtype: Option<CommDtype>,
    /// How windows are distributed over ranks [default: static].
    #[arg(long, value_enum)]
    pub(super) schedule: Option<Schedule>,
    /// Communication backend [default: mpi when started by mpirun/srun, else local].
    #[arg(long, value_enum)]
    pub(super) backend: Option<Backend>,
    /// Testing aid: rank R reads PATH instead of --data (simulates a node with another file).
    #[arg(long, value_name = "R=PATH", hide = true)]
    pub(super) debug_rank_data: Option<String>,
    /// Bootstrap replicates for the 95% confidence interval [default: 1000].
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) bootstrap_samples: Option<usize>,
    /// Print llama.cpp-style running values [1]…,[2]… on stdout.
    #[arg(long)]
    pub(super) print_chunks: bool,
    /// Run directory: the ledger of finished windows and the configuration go here
    /// [default: a fresh YYYYMMDD-HHMMSS under ~/.local/state/ppl/runs ($XDG_STATE_HOME,
    /// $PPL_STATE_DIR); `ppl runs` lists them].
    #[arg(long, value_name = "DIR")]
    pub(super) run_dir: Option<PathBuf>,
    /// Resume the run in DIR: windows its ledgers hold are not recomputed. Without --config
    /// or --model, the configuration saved in DIR/config.yaml is used (flags still override,
    /// e.g. another --ranks or mesh).
    #[arg(long, value_name = "DIR", conflicts_with = "run_dir")]
    pub(super) resume: Option<PathBuf>,
    /// Write results as JSON to this file (written only when the run completes).
    #[arg(short, long)]
    pub(super) output: Option<PathBuf>,
    /// Progress display on stderr.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub(super) progress: ProgressMode,
    /// Also write the HTML report [default path: --output with .html, else report.html].
    #[arg(long, num_args = 0..=1, value_name = "PATH")]
    pub(super) report: Option<Option<PathBuf>>,
    /// Compare with a previous results.json: explain a difference larger than its 95% CI
    /// (and exit 1).
    #[arg(long, value_name = "RESULTS.json")]
    pub(super) expect: Option<PathBuf>,
    /// No progress and no summary (the JSON file still gets written).
    #[arg(short, long)]
    pub(super) quiet: bool,
    /// Allow more local ranks than 4 per core (each rank keeps its own tokenizer, text and
    /// windows).
    #[arg(long)]
    pub(super) oversubscribe: bool,
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
    pub(super) fn backend(&self) -> Backend {
        self.backend
            .unwrap_or(if crate::comm::launcher::under_launcher() {
                Backend::Mpi
            } else {
                Backend::Local
            })
    }

    /// `ppl compare` shares the evaluation flags, but keeps no ledger and writes no report:
    /// these flags would do nothing there, so they are refused rather than ignored.
    pub(super) fn refuse_eval_only_flags(&self) -> anyhow::Result<()> {
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

    pub(super) fn run_options(&self) -> anyhow::Result<RunOptions> {
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

    pub(super) fn load_config(&self) -> anyhow::Result<Config> {
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
pub(super) fn check_model_format(format: Option<&str>, model: &Path) -> anyhow::Result<()> {
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
    pub(super) fn yaml(&self, keep_world: bool) -> String {
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

/// `--quantize-skip LIST`: whether the embeddings and the output layer are left alone.
pub(super) fn parse_skip(list: &str) -> anyhow::Result<(bool, bool)> {
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

pub(super) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Under an MPI launcher, ranks on one node share its cores: cores / local ranks.
pub(super) fn default_threads_under_mpi() -> usize {
    (default_threads() / crate::comm::launcher::ranks_on_this_node()).max(1)
}
