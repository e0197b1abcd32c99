//! `ppl inspect MODEL` and `ppl models`: what a GGUF file holds, read from its header only
//! (no weight is loaded): architecture, parameter count, tensor types, context length,
//! tokenizer, and the memory its weights take at each precision.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::model::{fetch, memory, GgufFile, LlamaConfig, Precision};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// GGUF model file or Hugging Face checkpoint directory.
    model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Cache directory [default: $PPL_CACHE_DIR, $XDG_CACHE_HOME/ppl or ~/.cache/ppl].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

/// One tensor type's share of the file.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TypeShare {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
}

/// What `ppl inspect --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Inspection {
    pub path: String,
    pub file_bytes: u64,
    pub gguf_version: u32,
    pub architecture: String,
    pub name: Option<String>,
    /// Whether `ppl eval` can evaluate it.
    pub supported: bool,
    pub parameters: u64,
    pub tensors: usize,
    pub types: BTreeMap<String, TypeShare>,
    pub context_length: Option<u64>,
    pub layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub vocab_size: Option<usize>,
    pub tokenizer: Option<String>,
    /// `GGUF vN`, or a Hugging Face checkpoint and its file count.
    pub format: String,
    /// Weights in memory once loaded at each precision (supported architectures only).
    pub weights_bytes: BTreeMap<String, u64>,
}

/// Reads the header of `path` and summarises it.
pub fn inspect(path: &Path) -> anyhow::Result<Inspection> {
    let g = GgufFile::open(path)?;
    let arch = g
        .get("general.architecture")
        .and_then(|v| match v {
            crate::model::gguf::Value::String(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "unknown".into());
    let string = |k: &str| match g.get(k) {
        Some(crate::model::gguf::Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    let num = |k: &str| g.get(&format!("{arch}.{k}")).and_then(|v| v.as_u64());
    let mut types: BTreeMap<String, TypeShare> = BTreeMap::new();
    let mut parameters = 0u64;
    for t in g.tensors.values() {
        let n: u64 = t.shape.iter().map(|&d| d as u64).product();
        parameters += n;
        let e = types
            .entry(crate::model::gguf::ggml_type_name(t.type_id))
            .or_insert(TypeShare {
                tensors: 0,
                parameters: 0,
                bytes: 0,
            });
        e.tensors += 1;
        e.parameters += n;
        e.bytes += t.size;
    }
    let supported = LlamaConfig::from_gguf(&g).is_ok();
    let weights_bytes = if supported {
        [
            Precision::Native,
            Precision::F32,
            Precision::Bf16,
            Precision::F16,
        ]
        .iter()
        .map(|&p| (p.to_string(), memory::weight_bytes(&g, p)))
        .collect()
    } else {
        BTreeMap::new()
    };
    let (mut vocab_size, mut tokenizer) = (
        match g.get("tokenizer.ggml.tokens") {
            Some(crate::model::gguf::Value::Array(a)) => Some(a.len()),
            _ => None,
        },
        string("tokenizer.ggml.model"),
    );
    let format = if g.is_hf() {
        if let Ok(t) = crate::tokenize::Tokenizer::from_gguf(&g) {
            (vocab_size, tokenizer) = (Some(t.vocab_size), Some(t.kind));
        }
        format!(
            "Hugging Face checkpoint, {} safetensors file(s)",
            g.file_count()
        )
    } else {
        format!("GGUF v{}", g.version)
    };
    Ok(Inspection {
        path: path.display().to_string(),
        file_bytes: g.file_bytes(),
        gguf_version: g.version,
        name: string("general.name"),
        supported,
        parameters,
        tensors: g.tensors.len(),
        types,
        context_length: num("context_length"),
        layers: num("block_count"),
        hidden_size: num("embedding_length"),
        heads: num("attention.head_count"),
        kv_heads: num("attention.head_count_kv"),
        vocab_size,
        tokenizer,
        format,
        weights_bytes,
        architecture: arch,
    })
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// The text `ppl inspect` prints.
pub fn render(i: &Inspection) -> String {
    let mut out = format!(
        "{}\n  name          {}\n  architecture  {} ({})\n  parameters    {} ({:.1} M)\n  file          {} ({}, {} tensors)\n",
        i.path,
        or_dash(i.name.clone()),
        i.architecture,
        if i.supported {
            "supported"
        } else {
            "not supported by ppl eval yet"
        },
        i.parameters,
        i.parameters as f64 / 1e6,
        mib(i.file_bytes),
        i.format,
        i.tensors
    );
    out += &format!(
        "  layers {}, hidden {}, heads {} (kv {}), context {}\n  tokenizer     {} ({} tokens)\n  tensor types:\n",
        or_dash(i.layers),
        or_dash(i.hidden_size),
        or_dash(i.heads),
        or_dash(i.kv_heads),
        or_dash(i.context_length),
        or_dash(i.tokenizer.clone()),
        or_dash(i.vocab_size)
    );
    for (t, s) in &i.types {
        out += &format!(
            "    {t:<6} {:>4} tensors {:>12} parameters {:>10}\n",
            s.tensors,
            s.parameters,
            mib(s.bytes)
        );
    }
    if !i.weights_bytes.is_empty() {
        out += "  weights in memory by --precision:\n";
        for (p, b) in &i.weights_bytes {
            out += &format!("    {p:<6} {}\n", mib(*b));
        }
    }
    out
}

pub fn run_inspect(args: InspectArgs) -> anyhow::Result<std::process::ExitCode> {
    let i = inspect(&crate::hub::local_model(&args.model)?)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&i)?);
    } else {
        print!("{}", render(&i));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `ppl models`: the GGUF files in the cache, one line each.
pub fn run_models(args: ModelsArgs) -> anyhow::Result<std::process::ExitCode> {
    let dir = args
        .cache_dir
        .unwrap_or_else(fetch::cache_dir)
        .join("models");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    files.sort();
    let hub = crate::hub::HubSettings::from_env().cache;
    let snapshots = hub.model_snapshots();
    if files.is_empty() && snapshots.is_empty() {
        println!(
            "no model in {} (fetch one with `ppl fetch-model smollm2` or `ppl fetch-model gemma3`)",
            dir.display()
        );
    }
    for f in files {
        match inspect(&f) {
            Ok(i) => println!(
                "{:<40} {:<8} {:>8.1} M params {:>10}  {}",
                f.file_name().unwrap_or_default().to_string_lossy(),
                i.architecture,
                i.parameters as f64 / 1e6,
                mib(i.file_bytes),
                if i.supported {
                    ""
                } else {
                    "(not supported yet)"
                }
            ),
            Err(e) => println!(
                "{:<40} unreadable: {e:#}",
                f.file_name().unwrap_or_default().to_string_lossy()
            ),
        }
    }
    if !snapshots.is_empty() {
        println!(
            "Hugging Face hub cache {} (use as --model hf:REPO[:FILE]):",
            hub.root.display()
        );
    }
    for (repo, commit, files) in snapshots {
        let gguf: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
        let checkpoint = files.iter().any(|f| f == "config.json");
        let short: String = commit.chars().take(12).collect();
        if checkpoint {
            println!(
                "  hf:{repo:<50} checkpoint ({} files) @{short}",
                files.len()
            );
        }
        for g in gguf {
            println!("  hf:{repo}:{g:<30} @{short}");
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
