//! The kernels' instruction-set levels give the same bits for every storage type: the test
//! model converted to each type ppl has its own kernels for (`ppl quantize`, `ppl export`;
//! `ppl synth` for Q5_K and Q5_1, and for IQ4_XS with IQ4_NL; IQ4_NL alone by rewriting a
//! Q4_0 file's type ids),
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
/// a `ppl quantize` conversion, a `ppl export` float copy, or (`q5_k` and `iq4_xs`, which
/// `ppl quantize` does not write) random weights of its shape from `ppl synth`: Q5_K or IQ4_XS
/// where rows are multiples of 256, llama.cpp's fallbacks Q5_1 or IQ4_NL elsewhere.
fn converted(dir: &Path, scheme: &str) -> PathBuf {
    if scheme == "q4_1" {
        return common::model();
    }
    if scheme == "iq4_nl" {
        return iq4_nl_of(&converted(dir, "q4_0"), &dir.join("smollm2-iq4_nl.gguf"));
    }
    let out = dir.join(format!("smollm2-{scheme}.gguf"));
    let mut cmd = ppl_cmd();
    if ["q5_k", "iq4_xs"].contains(&scheme) {
        cmd.args(["synth", "--shape", "smollm2-135m", "--type", scheme])
            .arg("--tokenizer-from")
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

/// An IQ4_NL model, which ppl reads but does not write: the Q4_0 file `q4_0` with every Q4_0
/// tensor's type id rewritten to IQ4_NL's (20) and every block's scale divided by 16. The two
/// types have the same block (an f16 scale and sixteen bytes of nibbles, 18 bytes), and
/// IQ4_NL's table runs from −127 to 113 where Q4_0's `n − 8` runs from −8 to 7, so the file is
/// a valid IQ4_NL model close to the Q4_0 one (its PPL near it, not astronomical).
fn iq4_nl_of(q4_0: &Path, out: &Path) -> PathBuf {
    let g = ppl::model::gguf::GgufFile::open(q4_0).unwrap();
    let mut bytes = std::fs::read(q4_0).unwrap();
    let mut rewritten = 0;
    for (name, info) in &g.tensors {
        if info.type_id != 2 {
            continue;
        }
        // The directory entry: name (u64 length, bytes), n_dims (u32), dims (u64, innermost
        // first), then the type id.
        let mut entry = (name.len() as u64).to_le_bytes().to_vec();
        entry.extend_from_slice(name.as_bytes());
        entry.extend_from_slice(&(info.shape.len() as u32).to_le_bytes());
        for &d in info.shape.iter().rev() {
            entry.extend_from_slice(&(d as u64).to_le_bytes());
        }
        entry.extend_from_slice(&2u32.to_le_bytes());
        let at = bytes
            .windows(entry.len())
            .position(|w| w == entry.as_slice())
            .unwrap_or_else(|| panic!("the directory entry of {name}"));
        let type_at = at + entry.len() - 4;
        bytes[type_at..type_at + 4].copy_from_slice(&20u32.to_le_bytes());
        let data = info.offset as usize..(info.offset + info.size) as usize;
        for block in bytes[data].chunks_exact_mut(18) {
            let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            block[..2].copy_from_slice(&half::f16::from_f32(d / 16.0).to_le_bytes());
        }
        rewritten += 1;
    }
    assert!(rewritten > 100, "{rewritten} Q4_0 tensors");
    std::fs::write(out, bytes).unwrap();
    let g = ppl::model::gguf::GgufFile::open(out).unwrap();
    assert_eq!(
        g.tensors.values().filter(|t| t.type_id == 20).count(),
        rewritten
    );
    out.to_path_buf()
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
    // Q3_K and Q2_K (their feed-forward down projections; Q4_0 elsewhere), IQ4_NL, IQ4_XS
    // (+ IQ4_NL), and the floats.
    for scheme in [
        "q4_1", "q8_0", "q4_0", "q4_k_m", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs",
        "bf16", "f16", "f32",
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
