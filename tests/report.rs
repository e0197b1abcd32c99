//! The HTML report and run comparisons, from real (small) runs.

mod common;

use std::path::{Path, PathBuf};

use ppl::report::Results;
use predicates::str::contains;
use scraper::{Html, Selector};

/// A small real run written to `dir/name.json` (and its report to `dir/name.html`).
fn run(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, Results) {
    let out = dir.join(format!("{name}.json"));
    common::ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(args)
        .args(["--progress", "none", "--quiet", "--report", "--output"])
        .arg(&out)
        .assert()
        .success();
    let r = ppl::report::load(&out).unwrap();
    (out, r)
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

#[test]
fn report_of_a_two_rank_run() {
    let dir = tempfile::tempdir().unwrap();
    let (json, r) = run(
        dir.path(),
        "two-ranks",
        &[
            "--ctx",
            "128",
            "--chunks",
            "12",
            "--precision",
            "f32",
            "--ranks",
            "2",
        ],
    );
    let html = std::fs::read_to_string(json.with_extension("html")).unwrap();
    let doc = Html::parse_document(&html);
    // Self-contained: no scripts, no external resources.
    assert!(doc
        .select(&sel("script, link, img, iframe"))
        .next()
        .is_none());
    assert!(!html.contains("src=") && !html.contains("href="));
    // One chart per chart section.
    for id in [
        "convergence",
        "rank-loss-index",
        "rank-loss-time",
        "utilization",
        "distribution",
    ] {
        let section = doc
            .select(&sel(&format!("section#{id}")))
            .next()
            .unwrap_or_else(|| panic!("section {id}"));
        assert_eq!(section.select(&sel("svg")).count(), 1, "section {id}");
    }
    // The numbers are those of results.json.
    let value = |css: &str| -> f64 {
        doc.select(&sel(css))
            .next()
            .unwrap()
            .value()
            .attr("data-value")
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        value("section#summary tr:nth-child(1) td").to_bits(),
        r.ppl.to_bits()
    );
    assert_eq!(
        value("section#summary tr:nth-child(2) td").to_bits(),
        r.ppl_err.unwrap().to_bits()
    );
    assert_eq!(value("section#summary tr:nth-child(4) td") as u64, r.tokens);
    let ci: Vec<f64> = doc
        .select(&sel("section#summary tr:nth-child(3) span"))
        .map(|e| e.value().attr("data-value").unwrap().parse().unwrap())
        .collect();
    assert_eq!(ci, r.ci95.unwrap().to_vec());
    // Two ranks: two loss curves and two utilization bars of three segments.
    let curves = doc
        .select(&sel("section#rank-loss-index path.series"))
        .count();
    assert_eq!(curves, 2);
    assert_eq!(
        doc.select(&sel("section#utilization rect.segment")).count(),
        6
    );
    // The histogram counts every window; the hardest windows are listed with their text.
    let binned: usize = doc
        .select(&sel("section#distribution rect.bin"))
        .map(|b| {
            b.value()
                .attr("data-count")
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(binned, 12);
    assert_eq!(r.hardest.len(), 10);
    let rows = doc.select(&sel("section#distribution tr")).count();
    assert_eq!(rows, 1 + r.hardest.len());
    assert!(r.hardest.windows(2).all(|w| w[0].mean_nll >= w[1].mean_nll));
    assert!(r.hardest.iter().all(|h| !h.excerpt.trim().is_empty()));
}

#[test]
fn comparing_runs_pairs_same_tokens_and_warns_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, ra) = run(
        dir.path(),
        "f32",
        &["--ctx", "128", "--chunks", "6", "--precision", "f32"],
    );
    let (b, rb) = run(dir.path(), "native", &["--ctx", "128", "--chunks", "6"]);
    let (c, _) = run(
        dir.path(),
        "ctx64",
        &["--ctx", "64", "--chunks", "6", "--precision", "f32"],
    );

    // Same tokens: a paired difference, no warning.
    let out = common::ppl_cmd()
        .args(["report", "--format", "json"])
        .arg(&a)
        .arg(&b)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let row = &v["runs"][1];
    assert!(row["warning"].is_null());
    let d = row["paired"]["delta_ppl"].as_f64().unwrap();
    assert!((d - (rb.ppl - ra.ppl)).abs() < 1e-12);
    assert!(row["paired"]["delta_ppl_se"].as_f64().unwrap() > 0.0);

    // Different ctx: an explicit warning in every format, and no paired figures.
    common::ppl_cmd()
        .args(["report", "--format", "md"])
        .arg(&a)
        .arg(&c)
        .assert()
        .success()
        .stdout(contains("**Warning:**"))
        .stdout(contains("did not score the same tokens"))
        .stderr(contains("different ctx"));
    let html_path = dir.path().join("cmp.html");
    common::ppl_cmd()
        .arg("report")
        .arg(&a)
        .arg(&b)
        .arg(&c)
        .arg("-o")
        .arg(&html_path)
        .assert()
        .success();
    let html = std::fs::read_to_string(&html_path).unwrap();
    let doc = Html::parse_document(&html);
    assert_eq!(doc.select(&sel("div.warning")).count(), 1);
    assert_eq!(doc.select(&sel("section#convergence svg")).count(), 1);
    assert_eq!(
        doc.select(&sel("section#convergence path.series")).count(),
        3
    );
    common::ppl_cmd()
        .args(["report", "--format", "txt"])
        .arg(&a)
        .assert()
        .success()
        .stdout(contains("Final estimate: PPL"));
}

#[test]
fn report_of_a_missing_or_foreign_file_is_a_clear_error() {
    common::ppl_cmd()
        .args(["report", "/nonexistent/results.json"])
        .assert()
        .failure()
        .stderr(contains("cannot read /nonexistent/results.json"));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.json");
    std::fs::write(&f, b"{\"hello\": 1}").unwrap();
    common::ppl_cmd()
        .arg("report")
        .arg(&f)
        .assert()
        .failure()
        .stderr(contains("is not a ppl results file"));
}

/// `ppl report` reads results.json back: the PPL it shows is the file's value to the last
/// bit (JSON numbers parsed exactly, not to within one unit in the last place).
#[test]
fn a_report_rendered_from_results_json_carries_its_exact_ppl() {
    let dir = tempfile::tempdir().unwrap();
    let (json, _) = run(dir.path(), "exact", &["--ctx", "64", "--chunks", "3"]);
    let text = std::fs::read_to_string(&json).unwrap();
    let in_json = text
        .split("\"ppl\": ")
        .nth(1)
        .and_then(|t| t.split([',', '\n']).next())
        .unwrap()
        .trim()
        .to_string();
    let html_path = dir.path().join("rendered.html");
    common::ppl_cmd()
        .arg("report")
        .arg(&json)
        .arg("-o")
        .arg(&html_path)
        .assert()
        .success();
    let html = std::fs::read_to_string(&html_path).unwrap();
    let doc = Html::parse_document(&html);
    let shown = doc
        .select(&sel("p.big span[data-value]"))
        .next()
        .and_then(|e| e.value().attr("data-value"))
        .unwrap()
        .to_string();
    assert_eq!(
        shown.parse::<f64>().unwrap().to_bits(),
        in_json.parse::<f64>().unwrap().to_bits(),
        "report {shown} vs results.json {in_json}"
    );
}
