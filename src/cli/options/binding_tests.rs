//! The two JSON bindings of a resolved configuration tied to the option table:
//! [`EvalConfig::scoring_json`](crate::run::EvalConfig) (what every rank must agree on before
//! scoring) and `values_json` (what a ledger is bound to, so what `--resume` must match). Both
//! are written by hand beside `EvalConfig`, below the command line; here every row of
//! [`EVAL_OPTIONS`] must be classified, and each classification is checked by changing the
//! option and seeing which binding changes. A new option that nobody classified, or one that
//! enters a binding it should not (or misses one it should), fails here.

use clap::Parser;

use super::*;
use crate::cli::EvalArgs;

#[derive(Parser)]
struct Eval {
    #[command(flatten)]
    args: EvalArgs,
}

/// One option and which bindings it enters.
struct Binds {
    /// The row's flag, or its key for a key-only row.
    option: &'static str,
    /// Flags given to both runs (what the change needs to mean something).
    context: &'static [&'static str],
    /// Flags that change the option from the first run to the second.
    change: &'static [&'static str],
    scoring: bool,
    values: bool,
}

const fn binds(
    option: &'static str,
    context: &'static [&'static str],
    change: &'static [&'static str],
    (scoring, values): (bool, bool),
) -> Binds {
    Binds {
        option,
        context,
        change,
        scoring,
        values,
    }
}

/// In both bindings, in the agreement only, in neither.
const BOTH: (bool, bool) = (true, true);
const AGREED: (bool, bool) = (true, false);
const NEITHER: (bool, bool) = (false, false);

/// A lossy mesh of two ranks: where activation compression changes values.
const PIPELINE: &[&str] = &["--pp", "2", "--ranks", "2"];
const INT4: &[&str] = &["--quantize", "int4"];

const CLASSIFIED: &[Binds] = &[
    // Which tokens are scored, and how: every value depends on them.
    binds("task", &["--ctx", "128"], &["--task", "wikitext"], BOTH),
    binds("method", &[], &["--method", "rolling"], BOTH),
    binds("ctx", &[], &["--ctx", "128"], BOTH),
    binds("stride", &["--method", "stride"], &["--stride", "7"], BOTH),
    binds("chunks", &[], &["--chunks", "3"], BOTH),
    binds("max-tokens", &[], &["--max-tokens", "1000"], BOTH),
    binds("precision", &[], &["--precision", "f32"], BOTH),
    binds("quantize", &[], INT4, BOTH),
    binds("group-size", INT4, &["--group-size", "64"], BOTH),
    binds("quantize-skip", INT4, &["--quantize-skip", "output"], BOTH),
    // A GPU's sums differ from the CPU's in the last bits.
    binds("device", &[], &["--device", "cuda"], BOTH),
    // Tensor and context parallelism sum in another order; compression is lossy.
    binds("tp", &[], &["--tp", "2", "--ranks", "2"], BOTH),
    binds("cp", &[], &["--cp", "2", "--ranks", "2"], BOTH),
    binds("comm-dtype", PIPELINE, &["--comm-dtype", "bf16"], BOTH),
    binds(
        "tp-backend",
        &["--device", "cuda", "--tp", "2", "--ranks", "2"],
        &["--tp-backend", "nccl"],
        BOTH,
    ),
    // The layout: agreed on, but a resume may use another.
    binds("pp", &[], PIPELINE, AGREED),
    binds(
        "dp-shard",
        &[],
        &["--dp-shard", "2", "--ranks", "2"],
        AGREED,
    ),
    binds(
        "dp-replicate",
        &["--pp", "2"],
        &["--dp-replicate", "2", "--ranks", "4"],
        AGREED,
    ),
    // The confidence interval, not a window's value.
    binds(
        "bootstrap-samples",
        &[],
        &["--bootstrap-samples", "10"],
        AGREED,
    ),
    // Never change a result (tested bit for bit elsewhere), or bound by fingerprint (the
    // model's and the text's sha256; the text field picks the text that is fingerprinted).
    binds("model", &[], &["--model", "/other/model.gguf"], NEITHER),
    binds("data", &[], &["--data", "/other/text.txt"], NEITHER),
    binds("text-field", &[], &["--text-field", "body"], NEITHER),
    binds(
        "model.format",
        &[],
        &["--set", "model.format=gguf"],
        NEITHER,
    ),
    binds("batch-size", &[], &["--batch-size", "4"], NEITHER),
    binds("threads", &[], &["--threads", "3"], NEITHER),
    binds("schedule", &[], &["--schedule", "dynamic"], NEITHER),
    binds("ranks", &[], &["--ranks", "3"], NEITHER),
    binds("backend", &[], &["--backend", "mpi"], NEITHER),
    // Rank 0's seed is broadcast: agreed without being compared.
    binds("seed", &[], &["--seed", "7"], NEITHER),
    // Where things go and how they are shown.
    binds("output", &[], &["--output", "/o/results.json"], NEITHER),
    binds("report", &["--output", "/o/r.json"], &["--report"], NEITHER),
    binds("run-dir", &[], &["--run-dir", "/r"], NEITHER),
    binds("resume", &[], &["--resume", "/r"], NEITHER),
    binds("expect", &[], &["--expect", "/e.json"], NEITHER),
    binds("progress", &[], &["--progress", "none"], NEITHER),
    binds("quiet", &[], &["--quiet"], NEITHER),
    binds("print-chunks", &[], &["--print-chunks"], NEITHER),
    binds("oversubscribe", &[], &["--oversubscribe"], NEITHER),
    binds(
        "debug-rank-data",
        &[],
        &["--debug-rank-data", "0=/x"],
        NEITHER,
    ),
    binds("set", &[], &["--set", "evaluation.batch_size=8"], NEITHER),
    // A configuration file holds the other rows' keys, each classified above.
    binds("config", &[], &[], NEITHER),
];

/// Both bindings of `flags`, with `--model /m/model.gguf --data /d/text.txt` unless they
/// give their own.
fn bindings(flags: &[&str]) -> (String, String) {
    let mut argv = vec!["eval"];
    for (flag, default) in [("--model", "/m/model.gguf"), ("--data", "/d/text.txt")] {
        if !flags.contains(&flag) {
            argv.extend([flag, default]);
        }
    }
    argv.extend(flags);
    let args = Eval::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{flags:?}: {e}"))
        .args;
    let cfg = args
        .resolve()
        .unwrap_or_else(|e| panic!("{flags:?}: {e:#}"))
        .eval;
    let dims = cfg.dims(cfg.ranks).unwrap();
    (cfg.scoring_json(), cfg.values_json(&dims))
}

#[test]
fn every_option_is_classified_for_the_bindings_once() {
    let name = |o: &EvalOption| o.flag.or(o.key).unwrap_or_default();
    for o in EVAL_OPTIONS {
        let n = CLASSIFIED.iter().filter(|b| b.option == name(o)).count();
        assert_eq!(
            n,
            1,
            "option {}: classify it once in CLASSIFIED (does it change a window's value, must the ranks agree on it?)",
            name(o)
        );
    }
    for b in CLASSIFIED {
        assert!(
            EVAL_OPTIONS.iter().any(|o| name(o) == b.option),
            "{} is classified but is no option",
            b.option
        );
    }
}

#[test]
fn each_option_enters_the_bindings_it_is_classified_in() {
    for b in CLASSIFIED.iter().filter(|b| !b.change.is_empty()) {
        let before = bindings(b.context);
        let changed: Vec<&str> = b.context.iter().chain(b.change).copied().collect();
        let after = bindings(&changed);
        assert_eq!(
            before.0 != after.0,
            b.scoring,
            "{}: scoring_json {} -> {}",
            b.option,
            before.0,
            after.0
        );
        assert_eq!(
            before.1 != after.1,
            b.values,
            "{}: values_json {} -> {}",
            b.option,
            before.1,
            after.1
        );
    }
}
