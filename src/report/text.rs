//! Plain-text summary (CI logs).

use super::compare::{compare, NamedRun};

pub fn render(runs: &[NamedRun]) -> String {
    let mut out = String::new();
    if runs.len() == 1 {
        return runs[0].results.summary();
    }
    out += &format!(
        "{:<28} {:>10} {:>9} {:>21} {:>8} {:>22}\n",
        "run", "PPL", "±", "95% CI", "tokens", "ΔPPL vs first (± se)"
    );
    for row in compare(runs) {
        let ci = row
            .ci95
            .map_or("-".into(), |[a, b]| format!("[{a:.4}, {b:.4}]"));
        let d = row.paired.as_ref().map_or("-".into(), |p| {
            format!("{:+.4} ± {:.4}", p.delta_ppl, p.delta_ppl_se)
        });
        out += &format!(
            "{:<28} {:>10.4} {:>9} {:>21} {:>8} {:>22}\n",
            row.name,
            row.ppl,
            row.ppl_err.map_or("-".into(), |e| format!("{e:.4}")),
            ci,
            row.tokens,
            d
        );
        if let Some(w) = row.warning {
            out += &format!("warning: {w}\n");
        }
    }
    out
}
