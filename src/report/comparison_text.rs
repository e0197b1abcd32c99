//! Plain-text rendering of a model comparison ([`CompareResults`]), laid out as llama.cpp's
//! KL-divergence mode prints it, so that the two can be read side by side.

use super::comparison::CompareResults;
use crate::eval::kld::Percentiles;

/// The summary as llama.cpp prints it.
pub fn render(r: &CompareResults) -> String {
    let s = &r.summary;
    let pct = |p: &Percentiles, scale: f64, unit: &str, name: &str| -> String {
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
    if let Some(f) = &r.base_file {
        out += &format!(
            "Base file {} ({}): {:.1} MB, {:.0} bytes per token (the base's final hidden states; its logits are recomputed exactly)\n",
            f.path,
            f.mode,
            f.bytes as f64 / 1e6,
            f.bytes_per_token
        );
    }
    if let Some(run) = r.run.as_ref().filter(|run| run.resumed) {
        out += &format!(
            "Resumed from {}: {} windows from the ledger, {} compared now\n",
            run.dir,
            run.windows_from_ledger,
            r.windows.len().saturating_sub(run.windows_from_ledger)
        );
    }
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
