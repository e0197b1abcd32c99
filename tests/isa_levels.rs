//! The kernels' instruction-set levels give the same bits for every storage type: the test
//! model converted to each type ppl has its own kernels for (`ppl quantize`, `ppl export`;
//! `ppl synth` for Q5_K and Q5_1),
//! evaluated under every `PPL_ISA` level this CPU runs — AMX included where it executes, the
//! portable level on one 32-token window (it takes seconds per window) — PPL, ±, CI, the exact
//! totals and every window's sum bit for bit. An MPI job on mixed CPUs relies on this.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_same_numbers, ppl_cmd};
use ppl::report::Results;

/// The levels, lowest first, as `PPL_ISA` and results.json name them.
const LEVELS: [&str; 5] = ["portable", "avx2", "avx512", "avx512bf16", "amx"];

fn rank(level: &str) -> usize {
    LEVELS
        .iter()
        .position(|l| *l == level)
        .unwrap_or_else(|| panic!("unknown level {level}"))
}

/// `ppl eval` of `model` at `PPL_ISA=isa`, `ctx` tokens per window, `chunks` windows.
fn eval_at(model: &Path, isa: &str, ctx: &str, chunks: &str) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    ppl_cmd()
        .env("PPL_ISA", isa)
        .arg("eval")
        .arg("--model")
        .arg(model)
        .arg("--data")
        .arg(common::wikitext())
        .args(["--ctx", ctx, "--chunks", chunks, "--threads", "2"])
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

fn level_of(r: &Results) -> String {
    r.system
        .kernels
        .as_ref()
        .expect("kernels recorded")
        .isa
        .clone()
}

/// The test model as storage type `scheme`: the file itself (Q4_1, its output layer Q8_0),
/// a `ppl quantize` conversion, a `ppl export` float copy, or (`q5_k`, which `ppl quantize`
/// does not write) random weights of its shape from `ppl synth`: Q5_K where rows are multiples
/// of 256, llama.cpp's fallback Q5_1 elsewhere.
fn converted(dir: &Path, scheme: &str) -> PathBuf {
    if scheme == "q4_1" {
        return common::model();
    }
    let out = dir.join(format!("smollm2-{scheme}.gguf"));
    let mut cmd = ppl_cmd();
    if scheme == "q5_k" {
        cmd.args([
            "synth",
            "--shape",
            "smollm2-135m",
            "--type",
            "q5_k",
            "--tokenizer-from",
        ])
        .arg(common::model())
        .arg("-o")
        .arg(&out);
    } else if ["f32", "f16", "bf16"].contains(&scheme) {
        cmd.arg("export")
            .arg(common::model())
            .args(["--dtype", scheme, "-o"])
            .arg(&out);
    } else {
        cmd.arg("quantize")
            .arg(common::model())
            .arg(&out)
            .args(["--type", scheme]);
    }
    cmd.assert().success();
    out
}

#[test]
fn every_storage_type_gives_the_same_bits_at_every_level() {
    let dir = tempfile::tempdir().unwrap();
    // The highest level this CPU runs: what a run capped at the top records.
    let top = level_of(&eval_at(&common::model(), "amx", "64", "1"));
    if rank(&top) < rank("amx") {
        let why = format!("SKIPPED: the AMX level (this CPU's kernels run at {top})");
        assert!(
            std::env::var("PPL_REQUIRE_AMX").map_or(true, |v| v != "1"),
            "PPL_REQUIRE_AMX=1 but {why}"
        );
        eprintln!("{why}");
    }
    let levels: Vec<&str> = LEVELS[1..=rank(&top)].to_vec();
    // Q4_1 (+ Q8_0 output), Q8_0, Q4_0, Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0), Q6_K, Q5_K (+ Q5_1),
    // Q3_K (its feed-forward down projections; Q4_0 elsewhere), and the floats.
    for scheme in [
        "q4_1", "q8_0", "q4_0", "q4_k_m", "q6_k", "q5_k", "q3_k", "bf16", "f16", "f32",
    ] {
        let model = converted(dir.path(), scheme);
        let base = eval_at(&model, levels[0], "128", "2");
        assert_eq!(level_of(&base), levels[0], "{scheme}");
        for &level in &levels[1..] {
            let r = eval_at(&model, level, "128", "2");
            assert_eq!(level_of(&r), level, "{scheme} at {level}");
            assert_same_numbers(&base, &r);
        }
        // The portable level on one 32-token window: every matrix and kernel of the model
        // still runs (on four panels of eight rows), and its float kernels, whose fused
        // multiply-adds are library calls on x86 without FMA, take seconds per window.
        let short = |isa| eval_at(&model, isa, "32", "1");
        let portable = short("portable");
        assert_eq!(level_of(&portable), "portable");
        assert_same_numbers(&short(top.as_str()), &portable);
        eprintln!(
            "{scheme}: PPL {} at every level of {levels:?} and portable",
            base.ppl
        );
    }
}
