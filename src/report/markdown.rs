//! Markdown summary (pull requests).

use super::compare::{compare, NamedRun};

pub fn render(runs: &[NamedRun]) -> String {
    let mut out = String::from("| run | PPL | ± | 95% CI | tokens | ΔPPL vs first | PPL ratio (95% CI) |\n|---|---:|---:|---|---:|---:|---|\n");
    let mut warnings = Vec::new();
    for row in compare(runs) {
        let ci = row
            .ci95
            .map_or("–".into(), |[a, b]| format!("{a:.4} – {b:.4}"));
        let (d, ratio) = match &row.paired {
            Some(p) => (
                format!("{:+.4} ± {:.4}", p.delta_ppl, p.delta_ppl_se),
                format!(
                    "{:.5} ({:.5} – {:.5})",
                    p.ppl_ratio, p.ppl_ratio_ci95[0], p.ppl_ratio_ci95[1]
                ),
            ),
            None => ("–".into(), "–".into()),
        };
        out += &format!(
            "| {} | {:.4} | {} | {ci} | {} | {d} | {ratio} |\n",
            row.name.replace('|', "\\|"),
            row.ppl,
            row.ppl_err.map_or("–".into(), |e| format!("{e:.4}")),
            row.tokens
        );
        warnings.extend(row.warning);
    }
    for w in warnings {
        out += &format!("\n> **Warning:** {w}\n");
    }
    out
}
