//! The HTML report: one self-contained file (inline CSS and SVG, no scripts, fonts or network)
//! with one chart per section. Numbers are printed rounded and carried exactly in `data-value`
//! attributes, so tools (and tests) can read them back.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::compare::{compare, NamedRun};
use super::svg::{escape, histogram, line_chart, stacked_bars, Series};
use super::Results;

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:980px;color:#222;line-height:1.4}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:12px;word-break:break-all}
.warning{background:#fff4e5;border-left:4px solid #D55E00;padding:8px 12px;margin:12px 0}
.big{font-size:28px;font-weight:bold}.muted{color:#666;font-size:12px}svg{max-width:100%;height:auto}";

fn num(v: f64, digits: usize) -> String {
    format!(r#"<td class="num" data-value="{v}">{v:.digits$}</td>"#)
}

fn opt_num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(
        || r#"<td class="num">–</td>"#.to_string(),
        |v| num(v, digits),
    )
}

/// Points of a curve, and of a band: (x, low, high).
type Curve = Vec<(f64, f64)>;
type Band = Vec<(f64, f64, f64)>;

/// Running PPL after each window (in index order) with a 95% band from the delta method.
fn running(r: &Results) -> (Curve, Band) {
    let (mut sum, mut sq, mut n) = (0.0, 0.0, 0.0);
    let mut line = Vec::with_capacity(r.windows.len());
    let mut band = Vec::with_capacity(r.windows.len());
    for w in &r.windows {
        sum += w.nll_sum;
        sq += w.nll_sum_sq;
        n += w.tokens as f64;
        if n == 0.0 {
            continue;
        }
        let m = sum / n;
        let x = (w.index + 1) as f64;
        line.push((x, m.exp()));
        if n > 1.0 && sq > 0.0 {
            let s = ((sq / n - m * m).max(0.0) / (n - 1.0)).sqrt();
            band.push((x, (m - 1.96 * s).exp(), (m + 1.96 * s).exp()));
        }
    }
    (line, band)
}

fn per_rank_series(r: &Results, by_time: bool) -> Vec<Series> {
    let mut by_rank: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
    for w in r.windows.iter().filter(|w| w.tokens > 0) {
        let x = if by_time {
            w.finished_s
        } else {
            w.index as f64
        };
        by_rank
            .entry(w.rank)
            .or_default()
            .push((x, w.nll_sum / w.tokens as f64));
    }
    by_rank
        .into_iter()
        .map(|(rank, mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: format!("rank {rank}"),
                points: pts,
            }
        })
        .collect()
}

fn section(out: &mut String, id: &str, title: &str, body: &str) {
    let _ = write!(
        out,
        r#"<section id="{id}"><h2>{}</h2>{body}</section>"#,
        escape(title)
    );
}

fn summary_table(r: &Results) -> String {
    let mut t = String::from("<table>");
    let ci = r.ci95.map_or("–".into(), |[a, b]| {
        format!(r#"<span data-value="{a}">{a:.4}</span> – <span data-value="{b}">{b:.4}</span>"#)
    });
    let _ = write!(
        t,
        r#"<tr><th>PPL</th>{}</tr><tr><th>± (llama.cpp)</th>{}</tr><tr><th>95% CI (block bootstrap)</th><td>{ci}</td></tr><tr><th>scored tokens</th><td class="num" data-value="{tok}">{tok}</td></tr><tr><th>mean NLL (nats)</th>{}</tr>"#,
        num(r.ppl, 4),
        opt_num(r.ppl_err, 4),
        num(r.mean_nll, 6),
        tok = r.tokens
    );
    if let (Some(w), Some(b), Some(bpb)) = (r.word_perplexity, r.byte_perplexity, r.bits_per_byte) {
        let _ = write!(t, "<tr><th>word perplexity</th>{}</tr><tr><th>byte perplexity</th>{}</tr><tr><th>bits per byte</th>{}</tr>", num(w, 4), num(b, 6), num(bpb, 6));
    }
    let _ = write!(
        t,
        "<tr><th>model</th><td><code>{}</code><br>{} · {} parameters · {} layers · sha256 <code>{}</code></td></tr>\
         <tr><th>data</th><td><code>{}</code><br>{} bytes · {} · sha256 <code>{}</code></td></tr>\
         <tr><th>world</th><td>{} backend · {} rank(s) · {} schedule</td></tr>\
         <tr><th>timings</th><td>eval {:.2} s · {:.1} tokens/s · total {:.2} s · peak RSS {}</td></tr>\
         <tr><th>versions</th><td>ppl {} · results schema {}</td></tr>\
         <tr><th>config</th><td><code>{}</code></td></tr></table>",
        escape(&r.model.path),
        escape(&r.model.architecture),
        r.model.parameters,
        r.model.layers,
        r.model.sha256,
        escape(&r.data.path),
        r.data.bytes,
        if r.data.whole_text_tokenized {
            format!("{} tokens", r.data.stream_tokens)
        } else {
            format!("first {} tokens (no more needed)", r.data.stream_tokens)
        },
        r.data.sha256,
        escape(&r.world.backend),
        r.world.size,
        r.world.schedule,
        r.timings.eval_s,
        r.timings.tokens_per_s,
        r.timings.total_s,
        r.system.peak_rss_bytes.map_or("–".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0)),
        escape(&r.ppl_version),
        r.schema_version,
        escape(&r.config.to_string())
    );
    t
}

fn single(out: &mut String, r: &Results) {
    let _ = write!(
        out,
        r#"<p class="big">PPL <span data-value="{v}">{v:.4}</span>{}</p>"#,
        r.ppl_err.map(|e| format!(" ± {e:.4}")).unwrap_or_default(),
        v = r.ppl
    );
    section(out, "summary", "Summary", &summary_table(r));

    let (line, band) = running(r);
    let chart = line_chart(
        "Running perplexity",
        "windows scored (in order)",
        "PPL",
        &[Series {
            name: "running PPL".into(),
            points: line,
        }],
        Some(&band),
    );
    section(out, "convergence", "Convergence", &(chart + "<p class=\"muted\">Band: 95% interval of the running estimate (delta method over tokens); the final interval in the summary is the block bootstrap.</p>"));

    let by_index = line_chart(
        "Mean NLL per window, by rank",
        "window index",
        "mean NLL (nats/token)",
        &per_rank_series(r, false),
        None,
    );
    section(out, "rank-loss-index", "Per-rank loss by window", &by_index);
    let by_time = line_chart(
        "Mean NLL per window over time, by rank",
        "seconds since the rank started scoring",
        "mean NLL (nats/token)",
        &per_rank_series(r, true),
        None,
    );
    section(
        out,
        "rank-loss-time",
        "Per-rank loss over wall time",
        &by_time,
    );

    let labels: Vec<String> = r
        .ranks
        .iter()
        .map(|s| format!("rank {} ({})", s.rank, s.host))
        .collect();
    let values: Vec<Vec<f64>> = r
        .ranks
        .iter()
        .map(|s| vec![s.compute_s, s.comm_s, s.idle_s])
        .collect();
    let mut util = stacked_bars(
        "Time per rank",
        "seconds",
        &labels,
        &["compute", "communication", "idle"],
        &values,
    );
    util.push_str("<table><tr><th>rank</th><th>host</th><th>windows</th><th>tokens/s</th><th>compute s</th><th>comm s</th><th>idle s</th><th>peak RSS MiB</th></tr>");
    for s in &r.ranks {
        let _ = write!(
            util,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td>{}{}{}{}<td class=\"num\">{}</td></tr>",
            s.rank,
            escape(&s.host),
            s.windows,
            num(s.tokens_per_s, 1),
            num(s.compute_s, 3),
            num(s.comm_s, 4),
            num(s.idle_s, 3),
            s.peak_rss_bytes.map_or("–".into(), |b| format!("{:.0}", b as f64 / 1048576.0))
        );
    }
    util.push_str("</table>");
    section(out, "utilization", "Per-rank utilization", &util);

    if let Some(mesh) = &r.mesh {
        let labels: Vec<String> = mesh
            .ranks
            .iter()
            .map(|m| format!("rank {}", m.rank))
            .collect();
        let values: Vec<Vec<f64>> = mesh
            .ranks
            .iter()
            .map(|m| vec![m.compute_s, m.comm_s])
            .collect();
        let mut body = stacked_bars(
            "Time per rank of the mesh",
            "seconds",
            &labels,
            &["compute", "communication (waiting included)"],
            &values,
        );
        let _ = write!(
            body,
            "<p>dp_replicate {} × dp_shard {} × cp {} × tp {} × pp {}, activations as {}</p><pre>{}</pre>",
            mesh.dims.dp_replicate,
            mesh.dims.dp_shard,
            mesh.dims.cp,
            mesh.dims.tp,
            mesh.dims.pp,
            mesh.comm_dtype,
            escape(&mesh.layout)
        );
        body.push_str("<table><tr><th>rank</th><th>host</th><th>pp, dp, shard, cp, tp</th><th>layers</th><th>weights MiB</th><th>peak RSS MiB</th><th>sent MiB</th><th>received MiB</th><th>compute s</th><th>comm s</th><th>ring MiB</th><th>ring s</th></tr>");
        let mib = |b: u64| format!("{:.1}", b as f64 / 1048576.0);
        for m in &mesh.ranks {
            let c = m.coords;
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}, {}, {}, {}, {}</td><td>{}–{}{}{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>{}{}<td class=\"num\">{}</td>{}</tr>",
                m.rank,
                escape(&m.host),
                c.pp,
                c.dp_replicate,
                c.dp_shard,
                c.cp,
                c.tp,
                m.layers[0],
                m.layers[1],
                if m.embedding { " + embedding" } else { "" },
                if m.output { " + output" } else { "" },
                mib(m.weights_bytes),
                m.peak_rss_bytes.map_or("–".into(), mib),
                mib(m.bytes_sent),
                mib(m.bytes_received),
                num(m.compute_s, 3),
                num(m.comm_s, 3),
                mib(m.ring_bytes_sent),
                num(m.ring_s, 3),
            );
        }
        body.push_str("</table>");
        section(out, "mesh", "Model-parallel mesh", &body);
    }

    // Per document for `rolling` (a document's windows form one group), else per window.
    let mut groups: BTreeMap<usize, (f64, u64)> = BTreeMap::new();
    for w in r.windows.iter().filter(|w| w.tokens > 0) {
        let key = if r.data.documents.is_some() {
            w.group
        } else {
            w.index
        };
        let g = groups.entry(key).or_default();
        g.0 += w.nll_sum;
        g.1 += w.tokens;
    }
    let means: Vec<f64> = groups.values().map(|(s, t)| s / *t as f64).collect();
    let unit = if r.data.documents.is_some() {
        "document"
    } else {
        "window"
    };
    let bins = ((means.len() as f64).sqrt().ceil() as usize).clamp(5, 40);
    let mut dist = histogram(
        &format!("Distribution of mean NLL per {unit}"),
        "mean NLL (nats/token)",
        &means,
        bins,
    );
    dist.push_str("<h3>Hardest windows</h3><table><tr><th>window</th><th>mean NLL</th><th>text scored (start)</th></tr>");
    for h in &r.hardest {
        let _ = write!(
            dist,
            "<tr><td>{}</td>{}<td>{}</td></tr>",
            h.index,
            num(h.mean_nll, 4),
            escape(&h.excerpt)
        );
    }
    dist.push_str("</table>");
    section(out, "distribution", "NLL distribution", &dist);
}

fn comparison(out: &mut String, runs: &[NamedRun]) {
    let rows = compare(runs);
    for w in rows.iter().filter_map(|r| r.warning.as_ref()) {
        let _ = write!(out, r#"<div class="warning">Warning: {}</div>"#, escape(w));
    }
    let mut t = String::from("<table><tr><th>run</th><th>PPL</th><th>±</th><th>95% CI</th><th>tokens</th><th>ΔPPL vs first (± se)</th><th>PPL ratio (95% CI)</th></tr>");
    for row in &rows {
        let ci = row
            .ci95
            .map_or("–".into(), |[a, b]| format!("{a:.4} – {b:.4}"));
        let (d, ratio) = match &row.paired {
            Some(p) => (
                format!(
                    r#"<td class="num" data-value="{}">{:+.4} ± {:.4}</td>"#,
                    p.delta_ppl, p.delta_ppl, p.delta_ppl_se
                ),
                format!(
                    "<td>{:.5} ({:.5} – {:.5})</td>",
                    p.ppl_ratio, p.ppl_ratio_ci95[0], p.ppl_ratio_ci95[1]
                ),
            ),
            None => ("<td>–</td>".into(), "<td>–</td>".into()),
        };
        let _ = write!(
            t,
            "<tr><td>{}</td>{}{}<td>{ci}</td><td class=\"num\">{}</td>{d}{ratio}</tr>",
            escape(&row.name),
            num(row.ppl, 4),
            opt_num(row.ppl_err, 4),
            row.tokens
        );
    }
    t.push_str("</table>");
    section(out, "runs", "Runs", &t);
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: r.name.clone(),
            points: running(&r.results).0,
        })
        .collect();
    section(
        out,
        "convergence",
        "Convergence",
        &line_chart(
            "Running perplexity",
            "windows scored (in order)",
            "PPL",
            &series,
            None,
        ),
    );
    let means: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: r.name.clone(),
            points: r
                .results
                .windows
                .iter()
                .filter(|w| w.tokens > 0)
                .map(|w| (w.index as f64, w.nll_sum / w.tokens as f64))
                .collect(),
        })
        .collect();
    section(
        out,
        "window-loss",
        "Loss per window",
        &line_chart(
            "Mean NLL per window",
            "window index",
            "mean NLL (nats/token)",
            &means,
            None,
        ),
    );
}

/// The report for one run, or a comparison of several.
pub fn render(runs: &[NamedRun]) -> String {
    let title = if runs.len() == 1 {
        format!("ppl report: {}", runs[0].name)
    } else {
        format!("ppl comparison of {} runs", runs.len())
    };
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = escape(&title)
    );
    if runs.len() == 1 {
        single(&mut out, &runs[0].results);
    } else {
        comparison(&mut out, runs);
    }
    out.push_str(
        "<p class=\"muted\">Generated by ppl. Colours: Okabe–Ito palette.</p></body></html>\n",
    );
    out
}
