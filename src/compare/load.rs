//! Loading both sides of a comparison on a rank: the compared model, and the base as a whole
//! model or (`--base-logits`) only its output layer with the rows stored by `--save-base`.
//! Everything that can be refused (another tokenizer, another plan, a damaged or foreign base
//! file, another vocabulary) is refused here, before any window is compared.

use std::path::PathBuf;

use super::{plan_binding, sha256, BaseSource, CompareOptions, Side};
use crate::eval::base_file;
use crate::model::{GgufFile, Llama, Partition};
use crate::run::{EvalConfig, EvalError, RankSetup};
use crate::tokenize::Tokenizer;

/// The base, ready on a rank: the whole model, or its output layer and the stored rows.
pub(super) struct LoadedBase {
    /// The whole base, or only its final norm and output layer (from a base file).
    pub(super) llama: Llama,
    pub(super) side: Side,
    pub(super) file: Option<StoredRows>,
}

pub(super) struct StoredRows {
    pub(super) path: PathBuf,
    pub(super) bytes: u64,
    /// Per window: its scored tokens' final hidden states, `hidden` f32 each.
    pub(super) windows: Vec<Vec<f32>>,
}

/// Loads the compared model and the base (a model or a base file), checking they fit.
pub(super) fn load_models(
    cfg: &EvalConfig,
    setup: &RankSetup,
    opts: &CompareOptions,
) -> Result<(Llama, LoadedBase), EvalError> {
    if !cfg.device.is_cpu() {
        return Err(EvalError::Config(format!(
            "ppl compare runs on the CPU only so far (--device {}): drop --device, or evaluate each model with `ppl eval --device {}` and compare their results.json",
            cfg.device, cfg.device
        )));
    }
    if opts.save_base.is_some() && matches!(opts.base, BaseSource::File { .. }) {
        return Err(EvalError::Config(
            "--save-base needs the base model (--base), not --base-logits".into(),
        ));
    }
    if opts.save_base.is_some() && cfg.resume {
        return Err(EvalError::Config(
            "--save-base with --resume: the ledger keeps the comparisons, not the base's rows, so a resumed comparison cannot write the base file; drop --save-base (or run the comparison again from the start to save the base)".into(),
        ));
    }
    let cpu = &candle_core::Device::Cpu;
    let vocab = setup.mc.vocab_size;
    let (path, precision, file) = match &opts.base {
        BaseSource::Model { path, precision } => (path.clone(), *precision, None),
        BaseSource::File { path, gguf } => {
            let (header, windows) = base_file::read(path)?;
            let now = plan_binding(cfg, setup, &header.binding.model_sha256);
            let differs = header.binding.differences(&now);
            if !differs.is_empty() {
                return Err(EvalError::Incompatible(format!(
                    "{} (--base-logits) was saved for another evaluation: {}; use the data and options it was saved with, or save it again with --save-base",
                    path.display(),
                    differs.join("; ").replace("ledger ", "file ")
                )));
            }
            let gguf = gguf
                .clone()
                .unwrap_or_else(|| PathBuf::from(&header.base_path));
            let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
            let stored = StoredRows {
                path: path.clone(),
                bytes,
                windows,
            };
            (gguf, header.base_precision, Some((header, stored)))
        }
    };
    if !path.exists() {
        return Err(EvalError::Io {
            action: "open the base model",
            path,
            purpose: " (--base)",
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            hint: "; give the GGUF (or checkpoint directory) the model is compared with",
        });
    }
    let gguf = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    // Different tokenizer files (a GGUF against a Hugging Face checkpoint of the same model)
    // are fine when they cut this data into the same windows of the same ids.
    let same_windows = || -> Result<bool, EvalError> {
        if tok.vocab_size != setup.tok.vocab_size {
            return Ok(false);
        }
        let loaded = crate::data::load(&cfg.data, &cfg.text_field)?;
        let theirs = crate::run::prepare(cfg, &tok, &loaded)?.plan;
        let ours = &setup.prepared.plan;
        Ok(theirs.windows.len() == ours.windows.len()
            && theirs
                .windows
                .iter()
                .zip(&ours.windows)
                .all(|(a, b)| a.input == b.input && a.targets == b.targets))
    };
    if tok.fingerprint != setup.tok.fingerprint && !same_windows()? {
        return Err(EvalError::Incompatible(format!(
            "{} and {} have different tokenizers ({} vs {} tokens; they cut this data into different ids): the comparison needs the same tokens; compare models of one family",
            path.display(),
            cfg.model.display(),
            tok.vocab_size,
            setup.tok.vocab_size
        )));
    }
    let side = Side {
        path: path.display().to_string(),
        sha256: sha256(&path)?,
        precision,
        quantize: None,
    };
    let base_config = crate::model::LlamaConfig::from_gguf(&gguf)?;
    let n_layers = base_config.n_layers;
    let part = match &file {
        // Only the final norm and the output layer.
        Some(_) => Partition {
            layers: n_layers..n_layers,
            embed: false,
            ..Partition::full(n_layers)
        },
        None => Partition::full(n_layers),
    };
    let file = match file {
        Some((header, stored)) => {
            if header.binding.model_sha256 != side.sha256 {
                return Err(EvalError::Incompatible(format!(
                    "{} was saved from a base with sha256 {}, but {} has {}: give the base it was saved from with --base",
                    stored.path.display(),
                    header.binding.model_sha256,
                    path.display(),
                    side.sha256
                )));
            }
            if header.hidden != base_config.hidden_size {
                return Err(EvalError::Incompatible(format!(
                    "{} stores rows of {} values but {} has a hidden size of {}",
                    stored.path.display(),
                    header.hidden,
                    path.display(),
                    base_config.hidden_size
                )));
            }
            check_stored_rows(&stored, setup, header.hidden)?;
            Some(stored)
        }
        None => None,
    };
    let llama = Llama::load(&gguf, precision, &part, None, cpu)?;
    if llama.config.vocab_size != vocab {
        return Err(EvalError::Incompatible(format!(
            "{} has a vocabulary of {} rows, {} of {vocab}",
            path.display(),
            llama.config.vocab_size,
            cfg.model.display(),
        )));
    }
    let base = LoadedBase { llama, side, file };
    let model = Llama::load(
        &setup.gguf,
        cfg.precision,
        &Partition::full(setup.mc.n_layers),
        cfg.quantize,
        cpu,
    )?;
    Ok((model, base))
}

/// Every window of the plan has its scored tokens' rows in the file (a file saved for this
/// plan always has; the binding and checksums make anything else very unlikely).
fn check_stored_rows(
    stored: &StoredRows,
    setup: &RankSetup,
    hidden: usize,
) -> Result<(), EvalError> {
    let plan = &setup.prepared.plan.windows;
    let rows = |i: usize| stored.windows.get(i).map_or(0, |w| w.len() / hidden.max(1));
    let short = (0..plan.len().max(stored.windows.len())).find(|&i| {
        plan.get(i).map(|w| w.targets.len() * hidden) != stored.windows.get(i).map(Vec::len)
    });
    match short {
        None => Ok(()),
        Some(i) => Err(EvalError::Incompatible(format!(
            "{} holds {} rows for window {i} but this plan scores {} tokens there; save it again with --save-base",
            stored.path.display(),
            rows(i),
            plan.get(i).map_or(0, |w| w.targets.len())
        ))),
    }
}
