//! `ppl synth`: the flags that choose a shape, a storage type and a tokenizer, and the summary
//! of what was written. The models themselves come from [`crate::model::synth`].

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;

use crate::model::synth::{Family, Shape, Synth, WeightType};
use crate::model::GgufFile;

pub(super) const LONG_ABOUT: &str = "\
Write a model with random weights and the shape of a real one (or custom dimensions), to \
measure speed and memory without downloading the real model.

THE PERPLEXITY OF RANDOM WEIGHTS MEANS NOTHING (it is near the vocabulary size); the speed \
and the memory of evaluating such a model are real, because they depend only on the shapes \
and the storage types.

The weights are uniform with the standard deviation 0.02 (norms 1.0), determined by --seed: \
the same flags write the same bytes. The tokenizer metadata comes from --tokenizer-from, and \
so does the vocabulary: the embedding table has one row per token of that tokenizer, \
whatever the named shape's own vocabulary is. The file is written one tensor at a time (an \
8B model never needs its size in memory).

Shapes (public config.json values; vocab replaced by the tokenizer's):
  smollm2-135m  llama   hidden 576,  30 layers, 9 heads / 3 KV, FFN 1536, tied
  llama3.2-1b   llama   hidden 2048, 16 layers, 32 / 8, FFN 8192, tied, rope 500000
  llama3.1-8b   llama   hidden 4096, 32 layers, 32 / 8, FFN 14336, rope 500000
  qwen2.5-7b    qwen2   hidden 3584, 28 layers, 28 / 4, FFN 18944, QKV biases, rope 1e6
  gemma3-1b     gemma3  hidden 1152, 26 layers, 4 / 1 (head 256), FFN 6912, tied, window 512
  mistral-7b    llama   hidden 4096, 32 layers, 32 / 8, FFN 14336, rope 10000 (v0.1)
  custom        --hidden --layers --heads --kv-heads --ffn [--head-dim --family --untied]

Examples:
  ppl synth --shape llama3.2-1b --type q4_k_m --tokenizer-from \"$(ppl fetch-model)\" -o 1b.gguf
  ppl synth --shape custom --hidden 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 \\
      --type q8_0 --tokenizer-from SmolLM2.gguf -o tiny.gguf
  ppl synth --shape llama3.2-1b --format safetensors --tokenizer-from SmolLM2.gguf -o 1b-hf/";

#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum SynthFormat {
    /// One GGUF file (v3) in --type.
    Gguf,
    /// A Hugging Face checkpoint directory: BF16 safetensors, config.json, tokenizer.json.
    Safetensors,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The real model whose shape to take (smollm2-135m, llama3.2-1b, llama3.1-8b,
    /// qwen2.5-7b, gemma3-1b, mistral-7b), or `custom` (give the dimensions).
    #[arg(long, value_name = "NAME")]
    shape: String,
    /// Storage type of the matrices (norms and biases stay F32); q4_k_m is llama.cpp's mix.
    /// Required for GGUF; a safetensors checkpoint is BF16.
    #[arg(long = "type", value_enum, value_name = "TYPE")]
    dtype: Option<WeightType>,
    /// A GGUF model whose tokenizer (tokenizer.ggml.*) the new model carries; it also sets
    /// the vocabulary size (e.g. the SmolLM2 test model: `ppl fetch-model`).
    #[arg(long, value_name = "GGUF")]
    tokenizer_from: PathBuf,
    /// Output GGUF file, or checkpoint directory (new or empty) for --format safetensors.
    #[arg(short, long)]
    output: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "gguf")]
    format: SynthFormat,
    /// custom: model width.
    #[arg(long, help_heading = "Custom shape")]
    hidden: Option<usize>,
    /// custom: transformer blocks.
    #[arg(long, help_heading = "Custom shape")]
    layers: Option<usize>,
    /// custom: attention heads.
    #[arg(long, help_heading = "Custom shape")]
    heads: Option<usize>,
    /// custom: key/value heads [default: --heads].
    #[arg(long, help_heading = "Custom shape")]
    kv_heads: Option<usize>,
    /// custom: feed-forward width.
    #[arg(long, help_heading = "Custom shape")]
    ffn: Option<usize>,
    /// custom: head size [default: hidden / heads].
    #[arg(long, help_heading = "Custom shape")]
    head_dim: Option<usize>,
    /// Vocabulary: only as a check, since it must equal the tokenizer's token count.
    #[arg(long, help_heading = "Custom shape")]
    vocab: Option<usize>,
    /// custom: the architecture family [default: llama].
    #[arg(long, value_enum, help_heading = "Custom shape")]
    family: Option<Family>,
    /// custom: a separate output layer instead of the tied embedding table.
    #[arg(long, help_heading = "Custom shape")]
    untied: bool,
    /// No progress lines on stderr.
    #[arg(short, long)]
    quiet: bool,
}

impl SynthArgs {
    /// The shape the flags describe (its vocabulary is set from the tokenizer later).
    fn shape(&self) -> anyhow::Result<Shape> {
        let custom_flags = [
            ("--hidden", self.hidden.is_some()),
            ("--layers", self.layers.is_some()),
            ("--heads", self.heads.is_some()),
            ("--kv-heads", self.kv_heads.is_some()),
            ("--ffn", self.ffn.is_some()),
            ("--head-dim", self.head_dim.is_some()),
            ("--family", self.family.is_some()),
            ("--untied", self.untied),
        ];
        if self.shape != "custom" {
            if let Some((flag, _)) = custom_flags.iter().find(|(_, given)| *given) {
                bail!(
                    "{flag} applies only to --shape custom; --shape {} has fixed dimensions",
                    self.shape
                );
            }
            return Ok(Shape::named(&self.shape)?);
        }
        let required = [
            ("--hidden", self.hidden),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--ffn", self.ffn),
        ];
        let missing: Vec<&str> = required
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(flag, _)| *flag)
            .collect();
        let [Some(hidden), Some(layers), Some(heads), Some(ffn)] = required.map(|(_, v)| v) else {
            bail!("--shape custom needs {}", missing.join(", "));
        };
        if heads == 0 {
            bail!("--heads 0: a model needs at least one attention head");
        }
        let family = self.family.unwrap_or(Family::Llama);
        let base = Shape::named("smollm2-135m")?;
        Ok(Shape {
            name: "custom".into(),
            family,
            hidden,
            layers,
            heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(hidden / heads),
            ffn,
            vocab: 0,
            tied: !self.untied,
            qkv_bias: family == Family::Qwen2,
            sliding_window: (family == Family::Gemma3).then_some(512),
            ..base
        })
    }
}

pub fn run(args: SynthArgs) -> anyhow::Result<ExitCode> {
    let shape = args.shape()?;
    let dtype = match (args.format, args.dtype) {
        (SynthFormat::Gguf, Some(t)) => t,
        (SynthFormat::Gguf, None) => bail!(
            "give the storage type with --type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m)"
        ),
        (SynthFormat::Safetensors, None | Some(WeightType::Bf16)) => WeightType::Bf16,
        (SynthFormat::Safetensors, Some(t)) => bail!(
            "--type {t} with --format safetensors: the checkpoint is written in bf16; drop --type (or write a GGUF)"
        ),
    };
    let tokenizer = GgufFile::open(&args.tokenizer_from).with_context(|| {
        format!(
            "--tokenizer-from {}: cannot read it as a GGUF model",
            args.tokenizer_from.display()
        )
    })?;
    let synth = Synth::new(shape, dtype, args.seed, &tokenizer)?;
    if let Some(v) = args.vocab.filter(|&v| v != synth.shape.vocab) {
        bail!(
            "--vocab {v}: the embedding table must have one row per token of the tokenizer, and {} has {}; drop --vocab or take the tokenizer from a model with {v} tokens",
            args.tokenizer_from.display(),
            synth.shape.vocab
        );
    }
    let quiet = args.quiet;
    let mut last_tenth = usize::MAX;
    let mut progress = |index: usize, count: usize, name: &str| {
        let tenth = index * 10 / count.max(1);
        if !quiet && tenth != last_tenth {
            last_tenth = tenth;
            eprintln!("synth: {:>3}% ({name})", tenth * 10);
        }
    };
    let written = match args.format {
        SynthFormat::Gguf => synth.write_gguf(&args.output, &mut progress)?,
        SynthFormat::Safetensors => synth.write_safetensors(&args.output, &mut progress)?,
    };
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, t) in &written.types {
        *counts.entry(format!("{t:?}")).or_default() += 1;
    }
    let types: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let s = &synth.shape;
    println!(
        "wrote {}: {} ({} parameters; hidden {}, {} layers, {} heads / {} KV, FFN {}, vocab {} from the tokenizer), {} tensors ({}), {:.1} MiB, seed {}",
        args.output.display(),
        s.name,
        s.parameters(),
        s.hidden,
        s.layers,
        s.heads,
        s.kv_heads,
        s.ffn,
        s.vocab,
        written.tensors,
        types.join(", "),
        written.bytes as f64 / (1u64 << 20) as f64,
        args.seed
    );
    println!("random weights: its PPL means nothing; its speed and memory are real");
    Ok(ExitCode::SUCCESS)
}
