//! `ppl compare`: a model against itself is KLD 0 and 100% same top token; a quantized model
//! has KLD > 0 (never negative), its PPL equals what `ppl eval` reports for it; results do not
//! depend on the number of ranks; a saved base reproduces the comparison bit for bit; models
//! with different tokenizers and base files made for other options are refused; an
//! interrupted comparison resumes (`--resume DIR`) to the uninterrupted bits, and a resume with
//! another base or data is refused.

mod common;

use common::{eval, ppl_cmd};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

fn compare(extra: &[&str]) -> serde_json::Value {
    let model = common::model();
    let mut with_base = vec!["--base", model.to_str().unwrap()];
    with_base.extend_from_slice(extra);
    compare_with(&with_base)
}

/// `ppl compare --model M --data wikitext` (ctx 128, 4 chunks, f32) with the base given in
/// `extra`.
fn compare_with(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.json");
    ppl_cmd()
        .arg("compare")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args([
            "--ctx",
            "128",
            "--chunks",
            "4",
            "--precision",
            "f32",
            "--quiet",
        ])
        .args(extra)
        .arg("--output")
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

#[test]
fn a_model_against_itself_is_identical() {
    let c = compare(&[]);
    assert_eq!(c["kld_mean"], 0.0);
    assert_eq!(c["kld_percentiles"]["max"], 0.0);
    assert_eq!(c["same_top"], 100.0);
    assert_eq!(c["delta_ppl"], 0.0);
    assert_eq!(c["ppl_base"], c["ppl_model"]);
    assert_eq!(c["tokens"], 4 * 63);
    assert_eq!(c["windows"].as_array().unwrap().len(), 4);
}

#[test]
fn a_quantized_model_against_its_base() {
    let c = compare(&["--quantize", "int4", "--group-size", "64"]);
    let f = |k: &str| c[k].as_f64().unwrap();
    assert!(f("kld_mean") > 0.0 && f("kld_mean_err") > 0.0);
    assert!(c["kld_percentiles"]["min"].as_f64().unwrap() >= 0.0);
    assert!(f("same_top") < 100.0 && f("same_top") > 50.0);
    // Each side's PPL is what `ppl eval` reports for it (float sums vs fixed point: 1e-9).
    let base = eval(&["--ctx", "128", "--chunks", "4", "--precision", "f32"]);
    let quant = eval(&[
        "--ctx",
        "128",
        "--chunks",
        "4",
        "--precision",
        "f32",
        "--quantize",
        "int4",
        "--group-size",
        "64",
    ]);
    assert!(((f("ppl_base") - base.ppl) / base.ppl).abs() < 1e-9);
    assert!(((f("ppl_model") - quant.ppl) / quant.ppl).abs() < 1e-9);
    assert!((f("delta_ppl") - (quant.ppl - base.ppl)).abs() < 1e-6);
    assert!(f("delta_ppl_err") > 0.0);
    let ratio = c["ppl_ratio"]["value"].as_f64().unwrap();
    assert!((ratio - quant.ppl / base.ppl).abs() < 1e-9);
    assert!(f("cor_ln_ppl") > 0.9 && f("cor_ln_ppl") <= 1.0);
}

#[test]
fn models_with_different_tokenizers_are_refused() {
    let gemma = common::gemma();
    ppl_cmd()
        .arg("compare")
        .arg("--base")
        .arg(&gemma)
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(["--chunks", "1"])
        .assert()
        .failure()
        .stderr(contains("different tokenizers"))
        .stderr(contains("panicked").not());
}

#[test]
fn a_missing_base_is_named_as_such() {
    ppl_cmd()
        .args(["compare", "--base", "/nonexistent/base.gguf", "--model"])
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .assert()
        .failure()
        .stderr(contains("/nonexistent/base.gguf (--base)"))
        .stderr(contains("panicked").not());
}

/// The numbers of a comparison: everything but timings, paths and the run's own layout.
fn numbers(c: &serde_json::Value) -> serde_json::Value {
    let mut c = c.clone();
    let o = c.as_object_mut().unwrap();
    for k in [
        "seconds",
        "config",
        "ranks",
        "rank_stats",
        "run",
        "base_file",
        "base",
    ] {
        o.remove(k);
    }
    c
}

#[test]
fn the_world_size_and_a_saved_base_change_no_bit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("base.pplbase");
    let file_s = file.to_str().unwrap();
    let q = ["--quantize", "int4", "--group-size", "64"];
    let one = compare(&q);
    let mut args = q.to_vec();
    args.extend(["--ranks", "2", "--batch-size", "3", "--save-base", file_s]);
    let two = compare(&args);
    assert_eq!(two["ranks"], 2);
    assert_eq!(numbers(&one), numbers(&two));
    // 4 windows × 63 scored tokens × 576 f32, plus a header and 4 window frames.
    let saved = &two["base_file"];
    assert_eq!(saved["mode"], "saved");
    let bytes = std::fs::metadata(&file).unwrap().len();
    assert_eq!(saved["bytes"], bytes);
    let rows = 4 * 63 * 576 * 4;
    assert!(bytes > rows && bytes < rows + 4096, "{bytes}");

    // Only the base's output layer and the file: the same bits, on 1 or 3 ranks.
    let mut args = q.to_vec();
    args.extend(["--base-logits", file_s]);
    let from_file = compare_with(&args);
    assert_eq!(from_file["base_file"]["mode"], "read");
    assert_eq!(from_file["base"]["sha256"], one["base"]["sha256"]);
    assert_eq!(numbers(&one), numbers(&from_file));
    args.extend(["--ranks", "3"]);
    assert_eq!(numbers(&one), numbers(&compare_with(&args)));
}

#[test]
fn a_base_file_for_other_options_or_damaged_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("base.pplbase");
    let file_s = file.to_str().unwrap();
    compare(&["--save-base", file_s]);
    let attempt = |file: &str, chunks: &str| {
        ppl_cmd()
            .arg("compare")
            .args(["--base-logits", file, "--model"])
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args(["--ctx", "128", "--chunks", chunks, "--precision", "f32"])
            .assert()
            .failure()
    };
    attempt(file_s, "3")
        .stderr(contains("saved for another evaluation"))
        .stderr(contains("windows: file 4, this run 3"))
        .stderr(contains("panicked").not());
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.path().join("cut.pplbase");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    attempt(cut.to_str().unwrap(), "4")
        .stderr(contains("cut.pplbase"))
        .stderr(contains("window 3 is cut short"))
        .stderr(contains("--save-base"))
        .stderr(contains("panicked").not());
}

#[test]
fn two_ranks_on_the_dynamic_schedule_change_no_bit() {
    let q = ["--quantize", "int4", "--group-size", "64"];
    let one = compare(&q);
    let mut args = q.to_vec();
    args.extend(["--ranks", "2", "--schedule", "dynamic"]);
    let two = compare(&args);
    assert_eq!(numbers(&one), numbers(&two));
    // The figures themselves, bit for bit (JSON numbers print every bit of an f64).
    for k in ["kld_mean", "ppl_base", "ppl_model", "delta_ppl", "same_top"] {
        let (a, b) = (one[k].as_f64().unwrap(), two[k].as_f64().unwrap());
        assert_eq!(a.to_bits(), b.to_bits(), "{k}");
    }
    assert!(one["kld_mean"].as_f64().unwrap() > 0.0);
    // Every window was compared once, by one of the two ranks, each rank's figures kept.
    let stats = two["rank_stats"].as_array().unwrap();
    assert_eq!(stats.len(), 2);
    let windows: u64 = stats.iter().map(|r| r["windows"].as_u64().unwrap()).sum();
    let tokens: u64 = stats.iter().map(|r| r["tokens"].as_u64().unwrap()).sum();
    assert_eq!((windows, tokens), (4, 4 * 63));
    assert_eq!(stats[1]["rank"], 1);
    assert_eq!(one["rank_stats"][0]["windows"], 4);
}

#[test]
fn a_panicking_rank_ends_the_comparison_and_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.json");
    let started = std::time::Instant::now();
    // Rank 1 compares windows 1 and 3 (static schedule) and crashes in its second unit.
    compare_cmd(&["--ranks", "2", "--output", out.to_str().unwrap()])
        .env("PPL_DEBUG_PANIC_RANK", "1")
        .assert()
        .failure()
        .stderr(contains("rank 1 ("))
        .stderr(contains("panicked: PPL_DEBUG_PANIC_RANK"))
        .stderr(contains("ppl compare --resume"));
    // Not the 600 s communication timeout: rank 0 was told at once.
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
    assert!(!out.exists());
}

/// Window records in the ledgers of a comparison's run directory.
fn ledger_records(dir: &std::path::Path) -> usize {
    ppl::eval::ledger::files(dir)
        .unwrap()
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).unwrap();
            ppl::eval::ledger::parse_records::<ppl::compare::WindowPart>(p, &bytes)
                .unwrap()
                .records
                .len()
        })
        .sum()
}

/// `ppl compare` of the model against itself (ctx 128, 4 chunks, quiet), with `extra`.
fn compare_cmd(extra: &[&str]) -> assert_cmd::Command {
    let model = common::model();
    let mut c = ppl_cmd();
    c.arg("compare")
        .arg("--base")
        .arg(&model)
        .arg("--model")
        .arg(&model)
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ctx", "128", "--chunks", "4", "--quiet"])
        .args(extra);
    c
}

/// `ppl compare` of the quantized model against the model (f32) in `run_dir`, with `extra`.
fn compare_in(run_dir: &std::path::Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = compare_cmd(&[
        "--precision",
        "f32",
        "--quantize",
        "int4",
        "--group-size",
        "64",
    ]);
    c.arg("--run-dir").arg(run_dir).args(extra);
    c
}

#[test]
fn an_interrupted_comparison_resumes_to_the_uninterrupted_bits() {
    let whole = compare(&["--quantize", "int4", "--group-size", "64"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // Rank 1 compares windows 1 and 3 (static schedule) and crashes in its second unit: its
    // first window, and whatever rank 0 finished meanwhile, are in the ledgers.
    compare_in(&dir, &["--ranks", "2"])
        .env("PPL_DEBUG_PANIC_RANK", "1")
        .assert()
        .failure()
        .stderr(contains("ppl compare --resume"));
    let kept = ledger_records(&dir);
    assert!((1..4).contains(&kept), "{kept} records kept");
    // `--resume DIR` alone: the saved configuration and base, on another world size and
    // schedule.
    let out = tmp.path().join("resumed.json");
    ppl_cmd()
        .args(["compare", "--resume"])
        .arg(&dir)
        .args([
            "--ranks",
            "3",
            "--schedule",
            "dynamic",
            "--quiet",
            "--output",
        ])
        .arg(&out)
        .assert()
        .success();
    let resumed: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(numbers(&whole), numbers(&resumed));
    for k in ["kld_mean", "ppl_base", "ppl_model", "delta_ppl", "same_top"] {
        let (a, b) = (whole[k].as_f64().unwrap(), resumed[k].as_f64().unwrap());
        assert_eq!(a.to_bits(), b.to_bits(), "{k}");
    }
    assert!(whole["kld_mean"].as_f64().unwrap() > 0.0);
    let run = &resumed["run"];
    assert_eq!(run["resumed"], true);
    assert_eq!(run["attempt"], 1);
    assert_eq!(run["windows_from_ledger"], kept);
    // Only the missing windows were compared again.
    let stats = resumed["rank_stats"].as_array().unwrap();
    let compared: u64 = stats.iter().map(|r| r["windows"].as_u64().unwrap()).sum();
    assert_eq!(compared as usize, 4 - kept);
    assert_eq!(whole["run"]["resumed"], false);
}

#[test]
fn a_resume_with_another_base_or_data_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    compare_in(&dir, &[]).assert().success();
    let ledger = "ledger-a0-r0.bin belongs to a different evaluation";
    let model = common::model();
    let resume = || {
        let mut c = ppl_cmd();
        c.arg("compare").arg("--resume").arg(&dir).arg("--quiet");
        c
    };
    // Another precision of the base.
    resume()
        .arg("--base")
        .arg(&model)
        .args(["--base-precision", "bf16"])
        .assert()
        .failure()
        .stderr(contains(ledger))
        .stderr(contains("base: ledger sha256"))
        .stderr(contains("precision f32, this run sha256"))
        .stderr(contains("precision bf16"))
        .stderr(contains("panicked").not());
    // Other data, with the run's flags given again.
    let other = tmp.path().join("other.txt");
    let mut text = std::fs::read_to_string(common::wikitext()).unwrap();
    text.insert_str(0, "A different first line.\n");
    std::fs::write(&other, text).unwrap();
    resume()
        .arg("--base")
        .arg(&model)
        .arg("--model")
        .arg(&model)
        .arg("--data")
        .arg(&other)
        .args(["--ctx", "128", "--chunks", "4", "--precision", "f32"])
        .args(["--quantize", "int4", "--group-size", "64"])
        .assert()
        .failure()
        .stderr(contains(ledger))
        .stderr(contains("data sha256"));
    // An evaluation is not a comparison, in either direction.
    ppl_cmd()
        .args(["eval", "--resume"])
        .arg(&dir)
        .args(["--progress", "none"])
        .assert()
        .failure()
        .stderr(contains(ledger))
        .stderr(contains("this run none (ppl eval)"));
    let eval_dir = tmp.path().join("eval");
    ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(&model)
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ctx", "128", "--chunks", "1", "--progress", "none"])
        .arg("--run-dir")
        .arg(&eval_dir)
        .assert()
        .success();
    ppl_cmd()
        .args(["compare", "--resume"])
        .arg(&eval_dir)
        .assert()
        .failure()
        .stderr(contains("no compare-base.json there"))
        .stderr(contains("--base BASE.gguf"));
    // The ledger keeps no stored rows: a resumed comparison cannot save the base.
    let file = tmp.path().join("base.pplbase");
    resume()
        .arg("--base")
        .arg(&model)
        .arg("--save-base")
        .arg(&file)
        .assert()
        .failure()
        .stderr(contains("--save-base with --resume"));
    assert!(!file.exists());
}
