//! ppl against llama.cpp and PyTorch on SmolLM2-135M Q4_1 + wikitext-2 (../shared/reference),
//! and the exactness guarantees: bit-identical results across batch sizes and thread counts.

mod common;

use common::{eval, reference};

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

#[test]
fn native_matches_llama_cpp_within_0_2_percent() {
    // Two local ranks of one thread each: the fastest layout on two cores, and bit-identical
    // to one rank (tests/distributed.rs).
    let r = eval(&[
        "--ctx",
        "512",
        "--chunks",
        "40",
        "--ranks",
        "2",
        "--threads",
        "2",
    ]);
    let refs = reference("smollm2-135m.wikitext2.ppl.json");
    let want = refs["llamacpp_q4_1"]["ppl"].as_f64().unwrap();
    let want_err = refs["llamacpp_q4_1"]["ppl_err"].as_f64().unwrap();
    assert_eq!(r.tokens, 10_200);
    assert_eq!(r.windows.len(), 40);
    assert!(
        rel(r.ppl, want) < 0.002,
        "native PPL {} vs llama.cpp {want}",
        r.ppl
    );
    assert!(
        rel(r.ppl_err.unwrap(), want_err) < 0.02,
        "± {:?} vs {want_err}",
        r.ppl_err
    );
    let [lo, hi] = r.ci95.unwrap();
    assert!(lo < r.ppl && r.ppl < hi, "CI {lo}..{hi} around {}", r.ppl);
}

#[test]
fn f32_matches_pytorch_within_0_05_percent() {
    let r = eval(&[
        "--ctx",
        "512",
        "--chunks",
        "40",
        "--precision",
        "f32",
        "--batch-size",
        "4",
        "--ranks",
        "2",
        "--threads",
        "2",
    ]);
    let refs = reference("smollm2-135m.wikitext2.ppl.json");
    let want = refs["torch_f32"]["ppl"].as_f64().unwrap();
    assert_eq!(r.tokens, 10_200);
    assert!(
        rel(r.ppl, want) < 0.0005,
        "f32 PPL {} vs PyTorch {want}",
        r.ppl
    );
    // The fixed-point total is exactly the sum of the windows' fixed-point sums.
    let sum: i128 = r.windows.iter().map(|w| w.nll_sum_fixed).sum();
    assert_eq!(sum, r.accumulator.sum);
}

#[test]
fn batch_size_does_not_change_a_bit() {
    for precision in ["native", "f32"] {
        let b1 = eval(&[
            "--ctx",
            "256",
            "--chunks",
            "5",
            "--precision",
            precision,
            "--batch-size",
            "1",
        ]);
        let b4 = eval(&[
            "--ctx",
            "256",
            "--chunks",
            "5",
            "--precision",
            precision,
            "--batch-size",
            "4",
        ]);
        common::assert_same_numbers(&b1, &b4);
    }
}

#[test]
fn thread_count_does_not_change_a_bit() {
    for precision in ["native", "f32"] {
        let t1 = eval(&["--chunks", "3", "--precision", precision, "--threads", "1"]);
        let t2 = eval(&["--chunks", "3", "--precision", precision, "--threads", "2"]);
        assert_eq!(t1.system.threads, 1);
        common::assert_same_numbers(&t1, &t2);
    }
}

#[test]
fn the_instruction_set_level_does_not_change_a_bit() {
    // This machine's level (AVX-512 where it executes) against the AVX2 cap, both precisions;
    // the portable level is compared kernel by kernel in the unit tests (a whole run of it
    // takes minutes).
    let run = |isa: &str, precision: &str| -> ppl::report::Results {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results.json");
        common::ppl_cmd()
            .env("PPL_ISA", isa)
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args([
                "--chunks",
                "2",
                "--precision",
                precision,
                "--progress",
                "none",
            ])
            .arg("--output")
            .arg(&out)
            .assert()
            .success();
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
    };
    for precision in ["native", "f32"] {
        let (top, avx2) = (run("avx512", precision), run("avx2", precision));
        let level = |r: &ppl::report::Results| r.system.kernels.as_ref().unwrap().isa.clone();
        assert!(["portable", "avx2", "avx512", "avx512bf16"].contains(&level(&top).as_str()));
        assert!(!level(&avx2).starts_with("avx512"));
        common::assert_same_numbers(&top, &avx2);
    }
}

#[test]
fn results_json_holds_the_documented_fields() {
    let r = eval(&["--chunks", "3", "--precision", "f32", "--threads", "2"]);
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "ppl", "ppl_err", "ci95", "tokens", "mean_nll", "windows", "config", "model", "data",
        "timings", "system",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["schema_version"], 1);
    assert_eq!(r.model.sha256, ppl::model::fetch::SHA256);
    assert_eq!(
        r.data.sha256,
        "bbf94c53a05abe9ee670d3b6343608095822c85e26de37c70b24fc571964574a"
    );
    // --chunks 3 at ctx 512 reads 1,536 tokens: only the beginning of the text is tokenized.
    assert!(!r.data.whole_text_tokenized);
    assert!(
        (1536..40_000).contains(&r.data.stream_tokens),
        "{}",
        r.data.stream_tokens
    );
    assert_eq!(r.windows[2].index, 2);
    assert_eq!(r.windows[2].start, 1024);
    assert_eq!(r.windows[2].tokens, 255);
    assert!((r.mean_nll.exp() - r.ppl).abs() < 1e-12 * r.ppl);
    assert!(r.system.peak_rss_bytes.unwrap() > 100 << 20);
    let kernels = r.system.kernels.as_ref().expect("system.kernels");
    assert!(["portable", "avx2", "avx512", "avx512bf16", "amx"].contains(&kernels.isa.as_str()));
    assert!(kernels.summary.starts_with(&kernels.isa));
    assert_eq!(v["config"]["precision"], "f32");
}
