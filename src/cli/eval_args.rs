//! `ppl eval`'s flags ([`EvalArgs`]) and their resolution, layered over a config file and
//! `--set`, into the validated [`Resolved`] configuration.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::checks;
use super::config::Config;
use super::options;
use clap::Args;

use crate::comm::codec::CommDtype;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::{DeviceSpec, Precision, Quantize, Scheme};
use crate::parallel::mesh::{ParallelDims, RequestedDims};
use crate::parallel::schedule::Schedule;
use crate::report::progress::ProgressMode;
use crate::run::{EvalConfig, RunOptions};

/// `ppl eval`'s flags: each field's type, short name and parser; its help, configuration key
/// and default are its row in [`super::options`] (the help is set from there).
#[derive(Debug, Args, Clone)]
#[command(mut_args(super::options::with_table_help))]
pub struct EvalArgs {
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(super) sets: Vec<String>,
    #[arg(short, long)]
    pub(super) model: Option<PathBuf>,
    #[arg(short = 'f', long)]
    pub(super) data: Option<PathBuf>,
    #[arg(long, value_name = "NAME")]
    pub(super) text_field: Option<String>,
    #[arg(long, value_enum)]
    pub(super) method: Option<Method>,
    #[arg(long, value_enum)]
    pub(super) task: Option<crate::task::Task>,
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) ctx: Option<usize>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) stride: Option<usize>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) chunks: Option<usize>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) max_tokens: Option<usize>,
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) batch_size: Option<usize>,
    #[arg(short, long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) threads: Option<usize>,
    #[arg(long, value_enum)]
    pub(super) precision: Option<Precision>,
    #[arg(long, value_name = "DEVICE")]
    pub(super) device: Option<DeviceSpec>,
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub(super) tp_backend: Option<TpBackend>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<u64>)]
    pub(super) seed: Option<u64>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) ranks: Option<usize>,
    #[arg(long, value_name = "N")]
    pub(super) dp_replicate: Option<i64>,
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub(super) dp_shard: Option<i64>,
    #[arg(long, value_name = "N")]
    pub(super) tp: Option<i64>,
    #[arg(long, value_name = "N")]
    pub(super) pp: Option<i64>,
    #[arg(long, value_name = "N")]
    pub(super) cp: Option<i64>,
    #[arg(long, value_enum, value_name = "TYPE")]
    pub(super) quantize: Option<Scheme>,
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) group_size: Option<usize>,
    #[arg(long, value_name = "LIST")]
    pub(super) quantize_skip: Option<String>,
    #[arg(long, value_enum)]
    pub(super) comm_dtype: Option<CommDtype>,
    #[arg(long, value_enum)]
    pub(super) schedule: Option<Schedule>,
    #[arg(long, value_enum)]
    pub(super) backend: Option<Backend>,
    #[arg(long, value_name = "R=PATH", hide = true)]
    pub(super) debug_rank_data: Option<String>,
    #[arg(long, allow_negative_numbers = true, value_parser = checks::whole::<usize>)]
    pub(super) bootstrap_samples: Option<usize>,
    #[arg(long)]
    pub(super) print_chunks: bool,
    #[arg(long, value_name = "DIR")]
    pub(super) run_dir: Option<PathBuf>,
    #[arg(long, value_name = "DIR", conflicts_with = "run_dir")]
    pub(super) resume: Option<PathBuf>,
    #[arg(short, long)]
    pub(super) output: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub(super) progress: Option<ProgressMode>,
    #[arg(long, num_args = 0..=1, value_name = "PATH")]
    pub(super) report: Option<Option<PathBuf>>,
    #[arg(long, value_name = "RESULTS.json")]
    pub(super) expect: Option<PathBuf>,
    #[arg(short, long)]
    pub(super) quiet: bool,
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

    /// `ppl compare` shares the evaluation flags (its ledger and `--resume` too), but writes
    /// no report: these flags would do nothing there, so they are refused rather than ignored.
    pub(super) fn refuse_eval_only_flags(&self) -> anyhow::Result<()> {
        let given = [
            ("--report", self.report.is_some()),
            ("--expect", self.expect.is_some()),
            ("--print-chunks", self.print_chunks),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            bail!(
                "{flag} applies to `ppl eval`, not to `ppl compare` (which writes its comparison with -o/--output); drop {flag}"
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
                    .unwrap_or_else(|| options::PROGRESS.default_choice())
            }),
            print_chunks: self.print_chunks,
            rank_data,
            config_yaml: None,
            oversubscribe: self.oversubscribe,
            ..RunOptions::default()
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

    /// Phase two: merges flags (which win), `--set`, the config file and the option table's
    /// defaults, and checks what can be checked without opening any file.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        use options::*;
        let c = self.load_config()?;
        let layers = Layers { config: &c };
        let scheme = match (self.quantize, c.str(QUANTIZE.key())) {
            (Some(s), _) => Some(s),
            (None, None) => None,
            (None, Some(t)) => scheme_from_quantizer_type(t)?,
        };
        let skip = layers
            .string(&QUANTIZE_SKIP, self.quantize_skip.as_ref())
            .unwrap_or_else(|| QUANTIZE_SKIP.default_parsed());
        let (skip_embeddings, skip_output) = parse_skip(&skip)?;
        let group_size = layers.count_or_default(&GROUP_SIZE, self.group_size);
        if group_size == 0 {
            bail!("--group-size must be at least 1");
        }
        let quantize = scheme.map(|scheme| Quantize {
            scheme,
            group_size,
            embeddings: !skip_embeddings,
            output: !skip_output,
        });
        let precision = layers.choice_or_default(&PRECISION, self.precision)?;
        let device = match (self.device, c.str(DEVICE.key())) {
            (Some(d), _) => d,
            (None, Some(s)) => s
                .parse()
                .map_err(|e| anyhow::anyhow!("{} = {s}: {e}", DEVICE.key()))?,
            (None, None) => DEVICE.default_parsed(),
        };
        let tp_backend = layers.choice_or_default(&TP_BACKEND, self.tp_backend)?;
        let parallel = RequestedDims {
            dp_replicate: layers.int(&DP_REPLICATE, self.dp_replicate),
            dp_shard: layers.int(&DP_SHARD, self.dp_shard),
            tp: layers.int(&TP, self.tp),
            cp: layers.int(&CP, self.cp),
            pp: layers.int(&PP, self.pp),
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
        let ranks = self.ranks.or(dp).unwrap_or_else(|| RANKS.default_parsed());
        // Check the degrees now when the world is known (local), so the error comes first.
        if parallel.any() && self.backend() == Backend::Local {
            ParallelDims::resolve(&parallel, ranks)?;
        }
        let comm_dtype = layers.choice_or_default(&COMM_DTYPE, self.comm_dtype)?;
        if ranks == 0 {
            bail!("--ranks must be at least 1");
        }
        let method = layers.choice_or_default(&METHOD, self.method)?;
        let task = layers.choice(&TASK, self.task)?;
        let ctx = layers.count(&CTX, self.ctx);
        let model = layers.path(&MODEL, self.model.as_ref());
        let (method, ctx, task) = match task {
            None => (method, ctx.unwrap_or_else(|| CTX.default_parsed()), None),
            Some(t) => {
                let method_given = self.method.is_some() || layers.in_config(&METHOD);
                crate::task::resolve_window(t, method, method_given, ctx, model.as_deref())?
            }
        };
        let threads = match layers.count(&THREADS, self.threads) {
            Some(0) => bail!("--threads must be at least 1"),
            Some(n) => crate::preflight::cap_threads(n),
            None if self.backend() == Backend::Mpi => default_threads_under_mpi(),
            None => default_threads(),
        };
        let stride = match (method, layers.count(&STRIDE, self.stride)) {
            (Method::Stride, Some(s)) => s,
            (Method::Stride, None) => (ctx / 2).max(1),
            (_, Some(_)) => bail!("--stride (data.stride) applies only to --method stride"),
            (_, None) => 0,
        };
        let max_tokens = layers.count(&MAX_TOKENS, self.max_tokens);
        if max_tokens.is_some() && method == Method::Rolling {
            bail!("--max-tokens applies to --method chunks and stride; use --chunks to limit documents");
        }
        let (Some(model), Some(data)) = (model, layers.path(&DATA, self.data.as_ref())) else {
            bail!("give the model and the data: --model M.gguf --data text.txt (or model.path / data.path in --config)");
        };
        let model = crate::hub::local_model(&model)?;
        let named = crate::data::named::local_data(&data, task.map(|t| t.name))?;
        let data = named.path;
        check_model_format(c.str(MODEL_FORMAT.key()), &model)?;
        let schedule = layers.choice_or_default(&SCHEDULE, self.schedule)?;
        let output = self
            .output
            .clone()
            .or_else(|| c.path(OUTPUT.key()).map(|d| d.join("results.json")));
        let report = self
            .report
            .clone()
            .or_else(|| (c.bool(REPORT.key()) == Some(true)).then_some(None));
        Ok(Resolved {
            eval: EvalConfig {
                model,
                data,
                method,
                ctx,
                stride,
                chunks: layers.count(&CHUNKS, self.chunks).or(named.max_windows),
                max_tokens,
                text_field: layers
                    .string(&TEXT_FIELD, self.text_field.as_ref())
                    .unwrap_or_else(|| TEXT_FIELD.default_parsed()),
                batch_size: layers.count_or_default(&BATCH_SIZE, self.batch_size),
                threads,
                precision,
                device,
                seed: self
                    .seed
                    .or_else(|| layers.count(&SEED, None).map(|s| s as u64))
                    .unwrap_or_else(|| SEED.default_parsed()),
                bootstrap_samples: layers
                    .count_or_default(&BOOTSTRAP_SAMPLES, self.bootstrap_samples),
                ranks,
                schedule,
                parallel,
                comm_dtype,
                tp_backend,
                quantize,
                run_dir: self
                    .resume
                    .clone()
                    .or_else(|| layers.path(&RUN_DIR, self.run_dir.as_ref())),
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
        options::write_yaml(self, keep_world)
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
