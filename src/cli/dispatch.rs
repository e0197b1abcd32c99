//! Runs a parsed command line: one arm per subcommand, the MPI entry, and the process-wide
//! settings (threads, logging) made before any work.

use std::process::ExitCode;

use anyhow::{bail, Context};

use super::compare_base::compare_base;
use super::eval_args::{parse_skip, Backend};
use super::{
    bench, checks, inspect, launch, runs, synth, validate, Cli, Command, ConfigAction,
    ExportFormat, FloatType,
};
use crate::model::{fetch, GgufFile, Quantize};
use crate::report::compare::NamedRun;
use crate::report::{self, Format};
use crate::run::{self, EvalConfig, RunOptions};
use crate::tokenize::Tokenizer;

/// Prints what `ppl export` / `ppl quantize` wrote: tensors per type and the size.
pub(super) fn print_written(
    out: &std::path::Path,
    w: &crate::model::gguf_write::Written,
    src_bytes: u64,
) {
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

/// Pins the compute thread count: candle's matmul pools read these variables once, on first
/// use, so they are set before any tensor exists; our own parallel loops use rayon's pool.
pub(super) fn configure_threads(n: usize) {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
}

pub(super) fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(checks::stderr_colour())
        .without_time()
        .try_init();
}

pub(super) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
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
                    configure_threads(run::threads_per_rank(cfg.threads, cfg.ranks));
                    run::evaluate(cfg, &opts)?
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
            let base = compare_base(&args)?;
            let mut run = args.eval.run_options()?;
            run.command = "ppl compare";
            run.config_yaml = Some(resolved.to_yaml_absolute());
            run.saved_files = vec![(
                crate::compare::SAVED_BASE,
                serde_json::to_string_pretty(&base.absolute())?,
            )];
            let opts = crate::compare::CompareOptions {
                base,
                save_base: args.save_base.clone(),
                run,
            };
            let r = match args.eval.backend() {
                Backend::Local => {
                    crate::preflight::check_local_ranks(cfg.ranks, args.eval.oversubscribe)
                        .map_err(anyhow::Error::msg)?;
                    configure_threads(run::threads_per_rank(cfg.threads, cfg.ranks));
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
                print!("{}", crate::report::comparison_text::render(&r));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tokenize(args) => {
            let g = GgufFile::open(&crate::hub::local_model(&args.model)?)?;
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
            let g = GgufFile::open(&crate::hub::local_model(&args.model)?)?;
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
            let g = GgufFile::open(&crate::hub::local_model(&args.input)?)?;
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
        Command::Data {
            action: super::DataAction::List,
        } => {
            print!("{}", crate::data::named::listing());
            Ok(ExitCode::SUCCESS)
        }
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
pub(super) fn run_mpi(
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
        opts.progress = Some(crate::report::progress::ProgressMode::None);
        opts.print_chunks = false;
    }
    Ok(run::evaluate_rank(&comm, cfg, &opts)?)
}

/// This process's MPI communicator and the library's version.
#[cfg(feature = "mpi")]
pub(super) fn mpi_comm() -> anyhow::Result<(Box<dyn crate::comm::Communicator>, String)> {
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
pub(super) fn mpi_comm() -> anyhow::Result<(Box<dyn crate::comm::Communicator>, String)> {
    bail!("this ppl was built without MPI support; rebuild with `cargo build --release --features mpi`")
}

#[cfg(not(feature = "mpi"))]
pub(super) fn run_mpi(
    _: &EvalConfig,
    _: &RunOptions,
    _: Option<usize>,
) -> anyhow::Result<Option<crate::report::Results>> {
    anyhow::bail!(
        "this ppl was built without MPI support; rebuild with `cargo build --release --features mpi` \
         (needs an MPI library: apt-get install libopenmpi-dev openmpi-bin), or pass --backend local"
    )
}
