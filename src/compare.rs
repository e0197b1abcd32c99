//! `ppl compare`: a model against a base on the same tokens. Both models score every window
//! of the model's configuration; per scored token the two full distributions are compared in
//! f64 ([`crate::eval::kld`]), and the summary gives what llama.cpp's KL-divergence mode
//! gives (PPL of both with ±, their correlation, the PPL ratio and ΔPPL with paired
//! uncertainties, KLD and Δp statistics with percentiles, same-top-token rate) plus per-window
//! rows, without writing a logit file.
//!
//! The base defaults to `--base-precision f32`: the base file's weights dequantized to f32,
//! which for a quantized base is exactly its f32 export.

use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::dist::local;
use crate::dist::schedule;
use crate::eval::kld::{self, Summary, TokenComparison};
use crate::eval::{self, LOGIT_ROWS};
use crate::fingerprint;
use crate::model::{GgufFile, Llama, ModelError, Partition, Precision, Quantize};
use crate::pipeline::{setup_rank, EvalConfig, EvalError};
use crate::tokenize::Tokenizer;

/// One side of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub path: String,
    pub sha256: String,
    pub precision: Precision,
    pub quantize: Option<Quantize>,
}

/// One window's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowComparison {
    pub index: usize,
    pub tokens: usize,
    pub ppl_base: f64,
    pub ppl_model: f64,
    pub kld_mean: f64,
    /// Percent of the window's tokens with the same top token.
    pub same_top: f64,
}

/// What `ppl compare --output` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareResults {
    pub ppl_version: String,
    pub base: Side,
    pub model: Side,
    #[serde(flatten)]
    pub summary: Summary,
    pub config: serde_json::Value,
    pub windows: Vec<WindowComparison>,
    pub seconds: f64,
}

/// Scores every window of `cfg` with the model (`cfg.model`, `cfg.precision`,
/// `cfg.quantize`) and the base (`base`, `base_precision`, never quantized) and compares.
pub fn compare(
    cfg: &EvalConfig,
    base: &PathBuf,
    base_precision: Precision,
) -> Result<CompareResults, EvalError> {
    let started = Instant::now();
    let comms = local::world(1);
    let cfg = EvalConfig {
        ranks: 1,
        // No ledger: nothing is written.
        run_dir: Some(std::env::temp_dir()),
        ..cfg.clone()
    };
    if !base.is_file() {
        return Err(EvalError::Config(format!(
            "cannot open the base model {} (--base): no such file; give the GGUF the model is compared with",
            base.display()
        )));
    }
    let setup = setup_rank(&comms[0], &cfg, &cfg.data)?;
    let base_gguf = GgufFile::open(base)?;
    let base_tok = Tokenizer::from_gguf(&base_gguf)?;
    if base_tok.fingerprint != setup.tok.fingerprint {
        return Err(EvalError::Config(format!(
            "{} and {} have different tokenizers ({} vs {} tokens, fingerprints differ): the comparison needs the same tokens; compare models of one family",
            base.display(),
            cfg.model.display(),
            base_tok.vocab_size,
            setup.tok.vocab_size
        )));
    }
    let full = Partition::full(setup.mc.n_layers);
    let model = Llama::load(&setup.gguf, cfg.precision, &full, cfg.quantize)?;
    let base_model = Llama::load(&base_gguf, base_precision, &full, None)?;
    if base_model.config.vocab_size != model.config.vocab_size {
        return Err(EvalError::Config(format!(
            "{} has a vocabulary of {} rows, {} of {}",
            base.display(),
            base_model.config.vocab_size,
            cfg.model.display(),
            model.config.vocab_size
        )));
    }
    let windows = &setup.prepared.plan.windows;
    let all: Vec<usize> = (0..windows.len()).collect();
    let vocab = model.config.vocab_size;
    let mut per_window: Vec<Vec<TokenComparison>> = Vec::with_capacity(windows.len());
    let mut last_report = Instant::now();
    for unit in schedule::units(windows, &all, cfg.batch_size) {
        let batch: Vec<_> = unit.iter().map(|&i| windows[i].clone()).collect();
        let ids = eval::batch_ids(&batch)?;
        let (rows_m, targets) = eval::scored_rows(&model.hidden_states(&ids)?, &batch)?;
        let (rows_b, _) = eval::scored_rows(&base_model.hidden_states(&ids)?, &batch)?;
        let mut tokens = Vec::with_capacity(targets.len());
        let mut r = 0;
        while r < targets.len() {
            let n = LOGIT_ROWS.min(targets.len() - r);
            let logits = |m: &Llama, rows: &candle_core::Tensor| -> Result<Vec<f32>, ModelError> {
                Ok(m.logits(&rows.narrow(0, r, n)?)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            };
            let lm = logits(&model, &rows_m)?;
            let lb = logits(&base_model, &rows_b)?;
            tokens.extend(kld::compare_rows(&lb, &lm, vocab, &targets[r..r + n]));
            r += n;
        }
        let mut k = 0;
        for w in &batch {
            per_window.push(tokens[k..k + w.targets.len()].to_vec());
            k += w.targets.len();
        }
        if last_report.elapsed().as_secs() >= 10 {
            tracing::info!("compared {} of {} windows", per_window.len(), windows.len());
            last_report = Instant::now();
        }
    }
    let all_tokens: Vec<TokenComparison> = per_window.iter().flatten().copied().collect();
    if all_tokens.is_empty() {
        return Err(EvalError::Config("no scored token to compare".into()));
    }
    let window_rows = per_window
        .iter()
        .enumerate()
        .map(|(index, t)| {
            let n = t.len().max(1) as f64;
            WindowComparison {
                index,
                tokens: t.len(),
                ppl_base: (t.iter().map(|x| x.nll_base).sum::<f64>() / n).exp(),
                ppl_model: (t.iter().map(|x| x.nll_model).sum::<f64>() / n).exp(),
                kld_mean: t.iter().map(|x| x.kld).sum::<f64>() / n,
                same_top: 100.0 * t.iter().filter(|x| x.same_top).count() as f64 / n,
            }
        })
        .collect();
    let sha = |p: &PathBuf| {
        fingerprint::sha256_file_cached(p)
            .map_err(|e| EvalError::Config(format!("cannot read {}: {e}", p.display())))
    };
    Ok(CompareResults {
        ppl_version: env!("CARGO_PKG_VERSION").to_string(),
        base: Side {
            path: base.display().to_string(),
            sha256: sha(base)?,
            precision: base_precision,
            quantize: None,
        },
        model: Side {
            path: cfg.model.display().to_string(),
            sha256: sha(&cfg.model)?,
            precision: cfg.precision,
            quantize: cfg.quantize,
        },
        summary: kld::summarize(&all_tokens),
        config: serde_json::to_value(&cfg).expect("config serializes"),
        windows: window_rows,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The summary as llama.cpp prints it.
pub fn render_text(r: &CompareResults) -> String {
    let s = &r.summary;
    let pct = |p: &kld::Percentiles, scale: f64, unit: &str, name: &str| -> String {
        [
            ("Maximum", p.max),
            ("99.9%  ", p.p99_9),
            ("99.0%  ", p.p99),
            ("95.0%  ", p.p95),
            ("90.0%  ", p.p90),
            ("Median ", p.median),
            ("10.0%  ", p.p10),
            (" 5.0%  ", p.p5),
            (" 1.0%  ", p.p1),
            (" 0.1%  ", p.p0_1),
            ("Minimum", p.min),
        ]
        .iter()
        .map(|(label, v)| format!("{label} {name}: {:>10.6}{unit}\n", v * scale))
        .collect()
    };
    let mut out = format!(
        "base:  {} ({})\nmodel: {} ({}{})\n{} tokens\n\n====== Perplexity statistics ======\n",
        r.base.path,
        r.base.precision,
        r.model.path,
        r.model.precision,
        r.model
            .quantize
            .map(|q| format!(", quantized at load to {} g{}", q.scheme, q.group_size))
            .unwrap_or_default(),
        s.tokens
    );
    out += &format!(
        "Mean PPL(Q)                   : {:>10.6} ± {:.6}\n",
        s.ppl_model, s.ppl_model_err
    );
    out += &format!(
        "Mean PPL(base)                : {:>10.6} ± {:.6}\n",
        s.ppl_base, s.ppl_base_err
    );
    out += &format!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:>9.2}%\n",
        100.0 * s.cor_ln_ppl
    );
    out += &format!(
        "Mean ln(PPL(Q)/PPL(base))     : {:>10.6} ± {:.6}\n",
        s.mean_ln_ratio.value, s.mean_ln_ratio.err
    );
    out += &format!(
        "Mean PPL(Q)/PPL(base)         : {:>10.6} ± {:.6}\n",
        s.ppl_ratio.value, s.ppl_ratio.err
    );
    out += &format!(
        "Mean PPL(Q)-PPL(base)         : {:>10.6} ± {:.6}\n\n====== KL divergence statistics ======\n",
        s.delta_ppl, s.delta_ppl_err
    );
    out += &format!(
        "Mean    KLD: {:>10.6} ± {:.6}\n",
        s.kld_mean, s.kld_mean_err
    );
    out += &pct(&s.kld_percentiles, 1.0, "", "KLD");
    out += "\n====== Token probability statistics ======\n";
    out += &format!(
        "Mean    Δp: {:>9.3} ± {:.3} %\n",
        100.0 * s.delta_p_mean.value,
        100.0 * s.delta_p_mean.err
    );
    out += &pct(&s.delta_p_percentiles, 100.0, " %", "Δp");
    out += &format!("RMS Δp    : {:>9.3} %\n", 100.0 * s.delta_p_rms);
    out += &format!(
        "Same top p: {:>9.3} ± {:.3} %\n",
        s.same_top, s.same_top_err
    );
    out
}
