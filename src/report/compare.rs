//! Comparing runs: whether two runs scored the same tokens, and the paired difference.
//!
//! Runs scored the same tokens when the data, the tokenizer and the windows (start, length,
//! scored count) are identical. Then, with per-window NLL differences `Dᵥ` over `Tᵥ` tokens,
//! `Δ = ΣDᵥ / ΣTᵥ` is the difference of mean NLL, and its standard error is computed over
//! windows (blocks, as the bootstrap does): `se = sqrt(n/(n−1) · Σ(Dᵥ − Δ·Tᵥ)²) / ΣTᵥ`. The PPL
//! ratio is `exp(Δ)` with interval `exp(Δ ± 1.96·se)`; `ΔPPL = PPL_b − PPL_a` with
//! `se ≈ PPL_b · se(Δ)`.

use serde::Serialize;

use super::Results;

/// A run with the name it is shown under (usually its file name).
pub struct NamedRun {
    pub name: String,
    pub results: Results,
}

/// The paired difference of a run against the first (base) run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Paired {
    /// Difference of mean NLL (nats per token), run − base.
    pub delta_mean_nll: f64,
    pub delta_mean_nll_se: f64,
    pub delta_ppl: f64,
    pub delta_ppl_se: f64,
    pub ppl_ratio: f64,
    pub ppl_ratio_ci95: [f64; 2],
}

/// One run's row in a comparison.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub name: String,
    pub ppl: f64,
    pub ppl_err: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub tokens: u64,
    /// Against the base run; `None` for the base itself or when the tokens differ.
    pub paired: Option<Paired>,
    /// Why the run cannot be paired with the base.
    pub warning: Option<String>,
}

/// Why `b` did not score the same tokens as `a`, if it did not.
pub fn token_mismatch(a: &Results, b: &Results) -> Option<String> {
    if a.data.sha256 != b.data.sha256 {
        return Some(format!(
            "different data (sha256 {}… vs {}…)",
            &b.data.sha256[..12.min(b.data.sha256.len())],
            &a.data.sha256[..12.min(a.data.sha256.len())]
        ));
    }
    if a.model.tokenizer_sha256 != b.model.tokenizer_sha256 {
        return Some("different tokenizer".into());
    }
    for key in ["method", "ctx", "stride", "chunks", "max_tokens"] {
        if a.config.get(key) != b.config.get(key) {
            return Some(format!(
                "different {key} ({} vs {})",
                b.config.get(key).map_or("none".into(), |v| v.to_string()),
                a.config.get(key).map_or("none".into(), |v| v.to_string())
            ));
        }
    }
    let shape = |r: &Results| {
        r.windows
            .iter()
            .map(|w| (w.start, w.input_tokens, w.tokens))
            .collect::<Vec<_>>()
    };
    if shape(a) != shape(b) {
        return Some("different windows".into());
    }
    None
}

/// The paired difference of `b` against `a` (which scored the same tokens).
pub fn paired(a: &Results, b: &Results) -> Paired {
    let n = a.windows.len() as f64;
    let total: f64 = a.windows.iter().map(|w| w.tokens as f64).sum();
    let diffs: Vec<(f64, f64)> = a
        .windows
        .iter()
        .zip(&b.windows)
        .map(|(wa, wb)| (wb.nll_sum - wa.nll_sum, wa.tokens as f64))
        .collect();
    let delta = diffs.iter().map(|d| d.0).sum::<f64>() / total;
    let ss: f64 = diffs.iter().map(|(d, t)| (d - delta * t).powi(2)).sum();
    let se = if n > 1.0 {
        (n / (n - 1.0) * ss).sqrt() / total
    } else {
        f64::NAN
    };
    Paired {
        delta_mean_nll: delta,
        delta_mean_nll_se: se,
        delta_ppl: b.ppl - a.ppl,
        delta_ppl_se: b.ppl * se,
        ppl_ratio: delta.exp(),
        ppl_ratio_ci95: [(delta - 1.96 * se).exp(), (delta + 1.96 * se).exp()],
    }
}

/// Rows for every run, each paired with the first when they scored the same tokens.
pub fn compare(runs: &[NamedRun]) -> Vec<Row> {
    let base = &runs[0].results;
    runs.iter()
        .enumerate()
        .map(|(i, r)| {
            let mismatch = (i > 0).then(|| token_mismatch(base, &r.results)).flatten();
            Row {
                name: r.name.clone(),
                ppl: r.results.ppl,
                ppl_err: r.results.ppl_err,
                ci95: r.results.ci95,
                tokens: r.results.tokens,
                paired: (i > 0 && mismatch.is_none()).then(|| paired(base, &r.results)),
                warning: mismatch.map(|m| {
                    format!("{} did not score the same tokens as {} ({m}): its PPL is not comparable and no paired difference is given", r.name, runs[0].name)
                }),
            }
        })
        .collect()
}

/// The outcome of `ppl eval --expect previous.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// False when the new PPL falls outside the previous run's 95% interval.
    pub ok: bool,
    pub message: String,
}

/// Options that never change a result (exactness: the PPL is bit-identical whatever the batch
/// size, threads, ranks or schedule), or that are compared by content instead (the model and
/// data paths: their SHA-256 below). Every other option counts, so a new option is compared
/// without being listed here.
const NEUTRAL_KEYS: [&str; 8] = [
    "batch_size",
    "threads",
    "ranks",
    "schedule",
    "resume",
    "run_dir",
    "model",
    "data",
];

/// Mesh degrees that change the arithmetic (a tensor- or context-parallel cut splits sums);
/// data, FSDP and pipeline degrees do not.
const ARITHMETIC_DEGREES: [&str; 2] = ["tp", "cp"];

/// The result-changing options of a run's `config`, flattened to `key → value`.
fn result_options(
    config: &serde_json::Value,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut out = std::collections::BTreeMap::new();
    let Some(map) = config.as_object() else {
        return out;
    };
    for (k, v) in map {
        if NEUTRAL_KEYS.contains(&k.as_str()) {
            continue;
        }
        if k == "parallel" {
            for d in ARITHMETIC_DEGREES {
                // An unset degree and a degree of 1 are the same mesh.
                let deg = v.get(d).and_then(|x| x.as_i64()).unwrap_or(1);
                out.insert(format!("parallel.{d}"), deg.into());
            }
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    // Results written before `device` existed ran on the CPU.
    out.entry("device".into()).or_insert_with(|| "cpu".into());
    out
}

/// Compares a run with a previous one of (supposedly) the same configuration, and explains a
/// difference by what changed: options, seed, model, data, tokenizer or ppl version.
pub fn expectation(prev: &Results, now: &Results) -> Expectation {
    let mut changed = Vec::new();
    let (before, after) = (result_options(&prev.config), result_options(&now.config));
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let (a, b) = (before.get(key), after.get(key));
        // An option absent from an older results file and null in a newer one is unset in both.
        let unset = |v: Option<&serde_json::Value>| v.is_none_or(|v| v.is_null());
        if a != b && !(unset(a) && unset(b)) {
            let show =
                |v: Option<&serde_json::Value>| v.map_or("unset".to_string(), |v| v.to_string());
            changed.push(format!("{key}: {} → {}", show(a), show(b)));
        }
    }
    if prev.model.sha256 != now.model.sha256 {
        changed.push(format!(
            "model file: sha256 {}… → {}…",
            &prev.model.sha256[..12.min(prev.model.sha256.len())],
            &now.model.sha256[..12.min(now.model.sha256.len())]
        ));
    }
    if prev.data.sha256 != now.data.sha256 {
        changed.push(format!(
            "data: sha256 {}… → {}…",
            &prev.data.sha256[..12.min(prev.data.sha256.len())],
            &now.data.sha256[..12.min(now.data.sha256.len())]
        ));
    }
    if prev.model.tokenizer_sha256 != now.model.tokenizer_sha256 {
        changed.push("tokenizer".into());
    }
    if prev.ppl_version != now.ppl_version {
        changed.push(format!(
            "ppl version: {} → {}",
            prev.ppl_version, now.ppl_version
        ));
    }
    let delta = now.ppl - prev.ppl;
    let explain = if changed.is_empty() {
        "nothing that should change the result changed (same options, seed, model, data and tokenizer)".to_string()
    } else {
        format!("what changed: {}", changed.join("; "))
    };
    if now.ppl.to_bits() == prev.ppl.to_bits() {
        return Expectation {
            ok: true,
            message: format!("matches the expected run bit for bit (PPL {:.4})", now.ppl),
        };
    }
    let inside = prev
        .ci95
        .is_some_and(|[lo, hi]| lo <= now.ppl && now.ppl <= hi);
    if inside {
        Expectation {
            ok: true,
            message: format!("PPL {:.4} differs from the expected {:.4} by {delta:+.4}, inside its 95% CI; {explain}", now.ppl, prev.ppl),
        }
    } else {
        let hint = if changed.is_empty() {
            "; a difference with identical inputs points at nondeterminism: please report it with both results files"
        } else {
            ""
        };
        Expectation {
            ok: false,
            message: format!(
                "PPL {:.4} differs from the expected {:.4} by {delta:+.4}, more than its 95% CI {}; {explain}{hint}",
                now.ppl,
                prev.ppl,
                prev.ci95.map_or("(none recorded)".into(), |[a, b]| format!("[{a:.4}, {b:.4}]"))
            ),
        }
    }
}
