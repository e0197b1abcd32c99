//! The option table against what clap defines, what the configuration accepts, what `resolve`
//! does and what the YAML writer writes.

use std::collections::BTreeSet;

use clap::{Args, Parser, ValueEnum};

use super::*;
use crate::cli::config::Config;
use crate::cli::eval_args::{check_model_format, parse_skip};
use crate::cli::EvalArgs;
use crate::model::Scheme;
use crate::report::progress::ProgressMode;

#[derive(Parser)]
struct Eval {
    #[command(flatten)]
    args: EvalArgs,
}

fn command() -> clap::Command {
    EvalArgs::augment_args(clap::Command::new("eval"))
}

fn args(argv: &[&str]) -> EvalArgs {
    match Eval::try_parse_from(std::iter::once("eval").chain(argv.iter().copied())) {
        Ok(e) => e.args,
        Err(e) => panic!("{argv:?}: {e}"),
    }
}

fn resolve(argv: &[&str]) -> Resolved {
    args(argv)
        .resolve()
        .unwrap_or_else(|e| panic!("{argv:?}: {e:#}"))
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// The dotted keys and values of a YAML text, as a configuration file reads it.
fn read_yaml(text: &str) -> Config {
    Config::parse(text, "written.yaml", &[], &no_env)
        .unwrap_or_else(|e| panic!("{e}\n--- in ---\n{text}"))
}

#[test]
fn every_clap_flag_has_one_row_and_every_row_flag_is_a_clap_flag() {
    let cmd = command();
    let clap_flags: BTreeSet<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
    let rows: Vec<&str> = EVAL_OPTIONS.iter().filter_map(|o| o.flag).collect();
    let row_flags: BTreeSet<&str> = rows.iter().copied().collect();
    assert_eq!(rows.len(), row_flags.len(), "a flag has two rows");
    assert_eq!(clap_flags, row_flags);
    let keys: Vec<&str> = EVAL_OPTIONS.iter().filter_map(|o| o.key).collect();
    let key_set: BTreeSet<&str> = keys.iter().copied().collect();
    assert_eq!(keys.len(), key_set.len(), "a key has two rows");
}

#[test]
fn every_flag_has_a_key_and_every_key_a_flag_unless_its_row_says_why() {
    for o in EVAL_OPTIONS {
        assert!(o.flag.is_some() || o.key.is_some(), "an empty row");
        let one_sided = o.flag.is_none() || o.key.is_none();
        assert_eq!(
            one_sided,
            !o.one_sided.is_empty(),
            "{:?} / {:?}: a reason exactly when the flag or the key is missing",
            o.flag,
            o.key
        );
        assert_eq!(
            o.key.is_some(),
            o.yaml.is_some(),
            "{:?}: a key is written",
            o.key
        );
    }
    let flag_only: Vec<&str> = EVAL_OPTIONS
        .iter()
        .filter(|o| o.key.is_none())
        .filter_map(|o| o.flag)
        .collect();
    // Options of one invocation (display, the configuration's own source, the process's
    // world): none of them changes what a configuration file describes.
    assert_eq!(
        flag_only,
        [
            "config",
            "set",
            "resume",
            "expect",
            "ranks",
            "backend",
            "progress",
            "quiet",
            "print-chunks",
            "oversubscribe",
            "debug-rank-data"
        ]
    );
    let key_only: Vec<&str> = EVAL_OPTIONS
        .iter()
        .filter(|o| o.flag.is_none())
        .filter_map(|o| o.key)
        .collect();
    assert_eq!(key_only, ["model.format"]);
}

/// A value of `kind` that the configuration accepts.
fn sample(kind: Kind) -> String {
    match kind {
        Kind::Path | Kind::Str => "x".into(),
        Kind::Int { min, .. } => min.to_string(),
        Kind::Bool => "true".into(),
        Kind::Choice(choices) => choices().last().cloned().unwrap_or_default(),
    }
}

#[test]
fn the_configuration_accepts_exactly_the_tables_keys() {
    let sets: Vec<String> = schema()
        .map(|(k, kind)| format!("{k}={}", sample(kind)))
        .collect();
    let c = Config::parse("", "--set", &sets, &no_env).unwrap();
    let accepted: BTreeSet<&str> = c.values.keys().map(String::as_str).collect();
    let keys: BTreeSet<&str> = EVAL_OPTIONS.iter().filter_map(|o| o.key).collect();
    assert_eq!(accepted, keys);
    let e = Config::parse("", "--set", &["evaluation.batchsize=2".into()], &no_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean 'evaluation.batch_size'?"), "{e}");
}

#[test]
fn enum_keys_take_the_names_their_flags_take() {
    let cmd = command();
    for o in EVAL_OPTIONS {
        let (Some(flag), Kind::Choice(choices)) = (o.flag, o.kind) else {
            continue;
        };
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag))
            .expect("every row flag is a clap flag (tested above)");
        let flag_names: Vec<String> = arg
            .get_possible_values()
            .iter()
            .map(|p| p.get_name().to_string())
            .collect();
        match flag {
            // A free list on the command line: every choice of the key parses as the flag does.
            "quantize-skip" => {
                for c in choices() {
                    assert!(parse_skip(&c).is_ok(), "{c}");
                }
            }
            // torchao's names for int4 and int8 in a file, one spelling per scheme.
            "quantize" => {
                assert_eq!(
                    choices().len(),
                    flag_names.len() + 1,
                    "none and every scheme"
                );
                for name in &flag_names {
                    let s = Scheme::from_str(name, false).unwrap();
                    let t = quantizer_type(s);
                    assert!(choices().contains(&t), "{t}");
                    assert_eq!(scheme_from_quantizer_type(&t).unwrap(), Some(s));
                }
                assert_eq!(scheme_from_quantizer_type("none").unwrap(), None);
            }
            _ => assert_eq!(choices(), flag_names, "--{flag}"),
        }
    }
}

#[test]
fn help_shows_the_tables_defaults_and_resolve_uses_them() {
    let cmd = command();
    let help = command().render_long_help().to_string();
    for arg in cmd.get_arguments() {
        let row = EVAL_OPTIONS
            .iter()
            .find(|o| o.flag == arg.get_long())
            .expect("every clap flag has a row (tested above)");
        let shown = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert_eq!(shown, row.help_text(), "--{:?}'s help", arg.get_long());
        assert!(
            arg.get_default_values().is_empty(),
            "--{:?}: the table's default is the only one",
            arg.get_long()
        );
        if let DefaultValue::Value(d) = row.default {
            assert!(shown.ends_with(&format!("[default: {d}]")), "{shown}");
            if !arg.is_hide_set() {
                assert!(
                    help.contains(&format!("[default: {d}]")),
                    "{d} not in --help"
                );
            }
            // The flag's own parser reads the default.
            let flag = format!("--{}", arg.get_long().unwrap_or_default());
            if let Err(e) = Eval::try_parse_from(["eval", flag.as_str(), d]) {
                panic!("{flag}'s default {d}: {e}");
            }
        }
    }
    // The values a run without options resolves to, read back from its YAML.
    let plain = resolve(&["--model", "/m/model.gguf", "--data", "/d/text.txt"]);
    let quantized = resolve(&[
        "--model",
        "/m/model.gguf",
        "--data",
        "/d/text.txt",
        "--quantize",
        "int4",
    ]);
    let (a, b) = (read_yaml(&plain.to_yaml()), read_yaml(&quantized.to_yaml()));
    for o in EVAL_OPTIONS {
        let (Some(key), DefaultValue::Value(d)) = (o.key, o.default) else {
            continue;
        };
        let resolved = a.values.get(key).or(b.values.get(key));
        assert_eq!(
            resolved.map(|v| v.to_string()).as_deref(),
            Some(d),
            "{key}: the help says {d}"
        );
    }
    assert_eq!(plain.eval.ranks.to_string(), "1");
    assert_eq!(RANKS.default, DefaultValue::Value("1"));
    let progress = args(&["--model", "m"]).run_options().unwrap().progress;
    assert_eq!(progress, Some(ProgressMode::Auto));
    assert_eq!(PROGRESS.default, DefaultValue::Value("auto"));
}

/// Resolves `argv`, writes its YAML, resolves that file and compares: the same configuration,
/// and the same YAML again. Returns the keys written.
fn round_trip(argv: &[&str]) -> BTreeSet<String> {
    let first = resolve(argv);
    let yaml = first.to_yaml();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let again = resolve(&["--config", file.to_str().unwrap()]);
    let (mut a, mut b) = (first.eval.clone(), again.eval.clone());
    // A file states every degree (1 for the unused ones): the same mesh, written out.
    let world = a.ranks;
    assert_eq!(a.dims(world).unwrap(), b.dims(world).unwrap(), "{yaml}");
    a.parallel = Default::default();
    b.parallel = Default::default();
    assert_eq!(a, b, "{yaml}");
    assert_eq!(first.output, again.output);
    assert_eq!(first.report, again.report);
    assert_eq!(first.ranks_given, again.ranks_given);
    assert_eq!(again.to_yaml(), yaml);
    read_yaml(&yaml).values.into_keys().collect()
}

#[test]
fn yaml_written_from_the_table_round_trips() {
    let mut written = round_trip(&[
        "--model",
        "/m/model.gguf",
        "--data",
        "/d/wiki test.txt",
        "--method",
        "stride",
        "--stride",
        "100",
        "--ctx",
        "256",
        "--chunks",
        "3",
        "--max-tokens",
        "1000",
        "--text-field",
        "body: text",
        "--batch-size",
        "2",
        "--threads",
        "3",
        "--precision",
        "f32",
        "--device",
        "cuda:1",
        "--schedule",
        "dynamic",
        "--seed",
        "7",
        "--bootstrap-samples",
        "10",
        "--quantize",
        "int4",
        "--group-size",
        "64",
        "--quantize-skip",
        "output",
        "--comm-dtype",
        "bf16",
        "--tp-backend",
        "nccl",
        "--tp",
        "2",
        "--dp-shard",
        "2",
        "--output",
        "/o/results.json",
        "--report",
        "--run-dir",
        "/r/run #1",
    ]);
    written.extend(round_trip(&[
        "--model",
        "/m/model.gguf",
        "--data",
        "/d/wiki.txt",
        "--task",
        "wikitext",
        "--ctx",
        "128",
        "--quantize",
        "q4_k_m",
    ]));
    // Plain data parallelism: the rank count is written as dp_replicate.
    round_trip(&[
        "--model",
        "/m/model.gguf",
        "--data",
        "/d/wiki.txt",
        "--ranks",
        "3",
    ]);
    let keys: BTreeSet<String> = EVAL_OPTIONS
        .iter()
        .filter_map(|o| o.key.map(String::from))
        .collect();
    assert_eq!(written, keys, "every key written by one of the cases");
}

#[test]
fn scalars_read_back_as_the_same_string() {
    for s in [
        "/tmp/a b.gguf",
        "true",
        "No",
        "1.5",
        "a: b",
        "#x",
        "-",
        "~",
        "",
        "null",
        "ünï",
        "cuda:0",
        "quote\"and\\slash",
        "plain_name",
    ] {
        let yaml = format!("k: {}\n", scalar(s));
        let doc = &yaml_rust2::YamlLoader::load_from_str(&yaml).unwrap()[0];
        assert_eq!(doc["k"].as_str(), Some(s), "{yaml}");
    }
    assert_eq!(scalar("/tmp/x.gguf"), "/tmp/x.gguf");
}

#[test]
fn model_format_follows_what_the_path_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    assert!(check_model_format(Some("safetensors"), dir.path()).is_ok());
    assert!(check_model_format(Some("gguf"), &file).is_ok());
    let e = check_model_format(Some("gguf"), dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("use format: safetensors"), "{e}");
    let e = check_model_format(Some("safetensors"), &file)
        .unwrap_err()
        .to_string();
    assert!(e.contains("use format: gguf"), "{e}");
    // What config show writes for a checkpoint directory is what the check accepts.
    let r = resolve(&[
        "--model",
        dir.path().to_str().unwrap(),
        "--data",
        "/d/t.txt",
    ]);
    assert!(r.to_yaml().contains("format: safetensors"));
}
