//! Hostile input, second round (issue 24), part one: wrong answers with exit 0, outputs that
//! replaced devices and links, misleading messages. Every case asserts the exit code, the
//! message, that no results file was written and that it ended in bounded time.
//! (Bounds on memory and time, ledgers and leftovers: `hostile_bounds.rs`.)

mod common;
#[path = "hostile_util/mod.rs"]
mod util;

use std::path::Path;

use util::{eval, model_copy, patch, small_text, tensor_span, u32_entry};

/// A failed `eval` that must leave no results file.
fn eval_refused(model: &Path, data: &Path, extra: &[&str], expected: &[&str]) -> util::Outcome {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let mut args = extra.to_vec();
    let out_s = out.to_str().unwrap().to_string();
    args.extend(["--output", &out_s]);
    let o = eval(model, data, &args, 60);
    o.refused(expected);
    assert!(!out.exists(), "a results file was written for a failed run");
    assert!(o.elapsed.as_secs() < 60);
    o
}

#[test]
fn nan_block_scales_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let (offset, _, ty) = tensor_span(&common::model(), "blk.16.ffn_down.weight");
    assert_eq!(ty, "Q4_1");
    // The first 200 Q4_1 blocks (20 bytes each) get a NaN scale, as in the issue.
    let nan = model_copy(dir.path(), "nan.gguf", |b| {
        for k in 0..200 {
            let at = offset + 20 * k;
            b[at..at + 2].copy_from_slice(&half_nan());
        }
    });
    for precision in ["native", "f32"] {
        eval_refused(
            &nan,
            &text,
            &["--precision", precision],
            &[
                "nan.gguf",
                "blk.16.ffn_down.weight",
                "non-finite",
                "block 0's scale is NaN",
            ],
        );
    }
}

fn half_nan() -> [u8; 2] {
    0x7e00u16.to_le_bytes()
}

#[test]
fn infinite_f32_weights_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let (offset, _, ty) = tensor_span(&common::model(), "blk.3.attn_norm.weight");
    assert_eq!(ty, "F32");
    let inf = model_copy(dir.path(), "inf.gguf", |b| {
        b[offset + 40..offset + 44].copy_from_slice(&f32::INFINITY.to_le_bytes());
    });
    eval_refused(
        &inf,
        &text,
        &[],
        &["blk.3.attn_norm.weight", "element 10 is infinite"],
    );
}

#[test]
fn overflowing_logits_stop_the_run_naming_the_window() {
    // Finite weights whose product overflows: the final norm at f32::MAX makes every logit
    // infinite, and each NLL NaN (it used to count as 0: PPL 1.0000, exit 0).
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let (offset, size, ty) = tensor_span(&common::model(), "output_norm.weight");
    assert_eq!(ty, "F32");
    let huge = model_copy(dir.path(), "overflow.gguf", |b| {
        for at in (offset..offset + size).step_by(4) {
            b[at..at + 4].copy_from_slice(&f32::MAX.to_le_bytes());
        }
    });
    eval_refused(
        &huge,
        &text,
        &["--precision", "f32"],
        &["window 0", "non-finite NLL", "scored token"],
    );
}

#[test]
fn an_implausible_perplexity_is_flagged_in_the_summary_and_the_results() {
    // A final norm 40× too large: finite, but the model is wildly overconfident.
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let (offset, size, _) = tensor_span(&common::model(), "output_norm.weight");
    let loud = model_copy(dir.path(), "loud.gguf", |b| {
        for at in (offset..offset + size).step_by(4) {
            let x = f32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            b[at..at + 4].copy_from_slice(&(x * 40.0).to_le_bytes());
        }
    });
    let out = dir.path().join("r.json");
    let o = eval(&loud, &text, &["--output", out.to_str().unwrap()], 60);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("WARNING:"), "{}", o.stdout);
    assert!(o.stdout.contains("meaningless"), "{}", o.stdout);
    let r = ppl::report::load(&out).unwrap();
    assert_eq!(r.warnings.len(), 1, "{:?} (PPL {})", r.warnings, r.ppl);
    assert!(r.ppl > 100.0 * r.model.vocab_size as f64, "PPL {}", r.ppl);
    // A sane run carries no warning (the field is absent from its JSON).
    let sane = dir.path().join("sane.json");
    let o = eval(
        &common::model(),
        &text,
        &["--output", sane.to_str().unwrap()],
        60,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(!o.stdout.contains("WARNING"));
    assert!(!std::fs::read_to_string(&sane)
        .unwrap()
        .contains("\"warnings\""));
    // The bounds themselves.
    assert!(ppl::report::plausibility(1.0, 49152).is_some());
    assert!(ppl::report::plausibility(f64::INFINITY, 49152).is_some());
    assert!(ppl::report::plausibility(5e6, 49152).is_some());
    assert!(ppl::report::plausibility(12.5, 49152).is_none());
}

#[test]
fn duplicate_metadata_keys_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    // general.file_type and llama.block_count have names of the same length: the first
    // becomes a second block_count of 2 (read last-wins, it gave 2 layers and PPL 3.9e7).
    let dup = model_copy(dir.path(), "dup.gguf", |b| {
        patch(
            b,
            &u32_entry("general.file_type", 3),
            &u32_entry("llama.block_count", 2),
        )
    });
    eval_refused(
        &dup,
        &text,
        &[],
        &["dup.gguf", "'llama.block_count' appears twice"],
    );
    let o = util::ppl(&["inspect", dup.to_str().unwrap()], 30);
    o.refused(&["appears twice"]);
}

#[test]
fn outputs_on_devices_are_written_directly_and_keep_being_devices() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let model = common::model();
    // /dev/full: ENOSPC is an error (exit 1), and /dev/full stays a character device.
    for flag in ["--output", "--report"] {
        let o = eval(&model, &text, &[flag, "/dev/full"], 60);
        o.refused(&["/dev/full", "No space left on device"]);
        let t = std::fs::metadata("/dev/full").unwrap().file_type();
        assert!(t.is_char_device(), "{flag} replaced /dev/full");
    }
    // /dev/null takes the results and stays a device.
    let o = eval(&model, &text, &["--output", "/dev/null"], 60);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    // `-`: the results JSON on stdout (the summary moves to stderr).
    let o = eval(&model, &text, &["--output", "-"], 60);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let r: serde_json::Value = serde_json::from_str(&o.stdout).expect("JSON on stdout");
    assert_eq!(r["tokens"], 31);
    assert!(o.stderr.contains("Final estimate"));
    assert!(util::entries(dir.path()) == ["text.txt"], "stray files");
}

#[test]
fn a_symlinked_output_is_followed_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let real = dir.path().join("real.json");
    std::fs::write(&real, "old").unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = eval(
        &common::model(),
        &text,
        &["--output", link.to_str().unwrap()],
        60,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let r = ppl::report::load(&real).unwrap();
    assert_eq!(r.tokens, 31);
    assert_eq!(
        util::entries(dir.path()),
        ["link.json", "real.json", "text.txt"]
    );
}

#[test]
fn bad_output_paths_are_refused_before_the_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let model = common::model();
    let text_s = text.to_str().unwrap().to_string();
    let as_dir = dir.path().to_str().unwrap().to_string();
    let under_file = format!("{text_s}/r.json");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--output", &as_dir],
            vec!["--output", "is a directory", "results.json"],
        ),
        (
            vec!["--report", &as_dir],
            vec!["--report", "is a directory"],
        ),
        (
            vec!["--output", &text_s],
            vec!["is the file given to --data", "choose another output path"],
        ),
        (vec!["--output", &under_file], vec!["is not a directory"]),
        (
            vec!["--output", "/proc/ppl-nothing/r.json"],
            vec!["no files under /dev or /proc"],
        ),
    ];
    for (args, expected) in cases {
        let o = eval(&model, &text, &args, 30);
        o.refused(&expected);
        // Refused before any weight was loaded or token scored: no summary, quickly.
        assert!(!o.stdout.contains("Final estimate"));
        assert!(o.elapsed.as_secs() < 10, "{args:?} took {:?}", o.elapsed);
    }
    assert_eq!(
        std::fs::read_to_string(&text).unwrap().len(),
        20_000,
        "the input was touched"
    );
    assert_eq!(util::entries(dir.path()), ["text.txt"]);
}

#[test]
fn zero_layers_or_context_name_the_metadata_not_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let no_layers = model_copy(dir.path(), "layers0.gguf", |b| {
        patch(
            b,
            &u32_entry("llama.block_count", 30),
            &u32_entry("llama.block_count", 0),
        )
    });
    let o = eval_refused(
        &no_layers,
        &text,
        &[],
        &[
            "llama.block_count is 0",
            "metadata is broken",
            "re-download",
        ],
    );
    assert!(!o.stderr.contains("--pp 0"), "{}", o.stderr);
    let no_ctx = model_copy(dir.path(), "ctx0.gguf", |b| {
        patch(
            b,
            &u32_entry("llama.context_length", 8192),
            &u32_entry("llama.context_length", 0),
        )
    });
    let o = eval_refused(&no_ctx, &text, &[], &["llama.context_length is 0"]);
    assert!(!o.stderr.contains("--ctx 0"), "{}", o.stderr);
}

#[test]
fn messages_name_the_real_problem_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    let model = common::model();
    let m = model.to_str().unwrap();
    let t = text.to_str().unwrap();
    // A negative count names the flag and the problem (it was "unexpected argument '-5'").
    for flag in ["--ctx", "--chunks", "--batch-size", "--threads"] {
        let o = util::ppl(&["eval", "-m", m, "-f", t, flag, "-5"], 10);
        assert_eq!(o.code, Some(2), "{}", o.stderr);
        assert!(
            o.stderr.contains(flag) && o.stderr.contains("negative"),
            "{}",
            o.stderr
        );
        assert!(!o.stderr.contains("unexpected argument"), "{}", o.stderr);
    }
    // An unknown top-level key is named as an unknown section (it was "did you mean
    // 'parallel.cp'?").
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "foo: 1\n").unwrap();
    let o = util::ppl(&["config", "show", "--config", cfg.to_str().unwrap()], 10);
    o.refused(&[
        "unknown key 'foo'",
        "not a section",
        "model, data, parallel",
    ]);
    assert!(!o.stderr.contains("parallel.cp"), "{}", o.stderr);
    std::fs::write(&cfg, "evalution: {seed: 1}\n").unwrap();
    let o = util::ppl(&["config", "show", "--config", cfg.to_str().unwrap()], 10);
    o.refused(&["did you mean 'evaluation.seed'?"]);
    // --model /dev/zero: a device, not "truncated (0 bytes)".
    let o = util::ppl(&["eval", "-m", "/dev/zero", "-f", t], 10);
    o.refused(&[
        "/dev/zero is a character device",
        "--model takes a GGUF file",
    ]);
    // --resume on a missing directory.
    let missing = dir.path().join("no-such-run");
    let o = util::ppl(&["eval", "--resume", missing.to_str().unwrap()], 10);
    o.refused(&["no such directory", "run directory of an earlier run"]);
    assert!(!o.stderr.contains("config.yaml"), "{}", o.stderr);
    // A data directory whose files are all empty.
    let empty_dir = dir.path().join("docs");
    std::fs::create_dir(&empty_dir).unwrap();
    std::fs::write(empty_dir.join("a.txt"), "").unwrap();
    std::fs::write(empty_dir.join("b.txt"), "  \n").unwrap();
    let o = util::ppl(
        &[
            "eval",
            "-m",
            m,
            "-f",
            empty_dir.to_str().unwrap(),
            "--ctx",
            "64",
        ],
        30,
    );
    o.refused(&["holds no text to evaluate", "2 visible file(s)"]);
    assert!(!o.stderr.contains("empty data file"), "{}", o.stderr);
    // Empty standard input is named as such, not by its temporary file.
    let mut cmd = std::process::Command::new(util::ppl_bin());
    cmd.args(["eval", "-m", m, "--data", "-", "--ctx", "64"]);
    let o = util::run_bounded(cmd, Some(b""), std::time::Duration::from_secs(30));
    o.refused(&["standard input (--data -) is empty"]);
    assert!(!o.stderr.contains("ppl-stdin"), "{}", o.stderr);
    // An OS error is printed once.
    let o = util::ppl(
        &["tokenize", "-m", m, "--file", dir.path().to_str().unwrap()],
        10,
    );
    o.refused(&["os error 21"]);
    assert_eq!(o.stderr.matches("os error 21").count(), 1, "{}", o.stderr);
    let o = util::ppl(&["eval", "-m", "/nonexistent.gguf", "-f", t], 10);
    o.refused(&["cannot open model file /nonexistent.gguf"]);
    assert_eq!(o.stderr.matches("os error 2)").count(), 1, "{}", o.stderr);
}

#[test]
fn warnings_carry_no_colour_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let text = small_text(dir.path());
    // A thread count far above the cores: capped, with a warning (stderr is a file here).
    let o = eval(&common::model(), &text, &["--threads", "100000"], 60);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("--threads 100000 is more than"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains('\x1b'), "ANSI codes in {:?}", o.stderr);
    assert!(o.stdout.contains("Final estimate"));
}
