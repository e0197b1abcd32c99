//! The `ppl` command line. Parsing happens in two phases, as in ripgrep: clap turns argv
//! into raw [`EvalArgs`], then [`EvalArgs::resolve`] applies defaults and produces the
//! validated [`EvalConfig`] the pipeline runs.

mod bench;
mod checks;
mod compare_base;
pub mod config;
mod dispatch;
mod eval_args;
pub mod inspect;
mod launch;
mod options;
mod runs;
mod synth;
mod validate;
pub mod yaml_bounds;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::model::{Precision, Scheme};
use crate::report::Format;

use self::dispatch::{init_logging, run};
use self::eval_args::default_threads;
pub use self::eval_args::{Backend, EvalArgs, Resolved};

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
    /// Datasets by name: `ppl data list` shows the names `--data` takes.
    Data {
        #[command(subcommand)]
        action: DataAction,
    },
}

#[derive(Debug, Subcommand)]
enum DataAction {
    /// The dataset names --data takes (wikitext-2, …), their repositories and splits.
    List,
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

#[derive(Debug, Args)]
struct CompareArgs {
    /// The base model (GGUF) the model is compared with (with --resume: the run's, by default).
    #[arg(
        long,
        value_name = "BASE.gguf",
        required_unless_present_any = ["base_logits", "resume"]
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

/// Entry point: runs the command and maps errors to a message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    // The kernels' instruction-set probe forks a child: done first, while the process is small,
    // has one thread and no MPI state (some MPI transports object to a fork after their start).
    crate::model::kernels::isa_choice();
    crate::model::heap::tune_for_inference();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", checks::error_message(&e));
            ExitCode::FAILURE
        }
    }
}
