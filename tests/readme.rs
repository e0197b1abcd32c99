//! The README's examples, run: every command line of every `sh` block is executed (in a
//! scratch directory, with the test model and a slice of WikiText-2 under the README's names,
//! evaluations shrunk to `--ctx 64 --chunks 2`) and its exit code and key output checked.
//!
//! Every command line must be listed in [`EXAMPLES`] with what to do with it — run it (the
//! default checks of its subcommand, or a stated exit code and lines), run a stated stand-in,
//! or skip it with the reason — and every entry must still be in the README. So a README that
//! drifts from the program, or gains an example nobody checks, fails here.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::hub_server::{HubServer, Repo};

/// What to do with one README command line.
#[derive(Clone, Copy)]
enum Action {
    /// Run it; exit 0 and the subcommand's default checks ([`default_checks`]).
    Run,
    /// Run it; this exit code, and stdout+stderr containing these lines.
    Expect(i32, &'static [&'static str]),
    /// Run this command instead (the README's is a synopsis, or too heavy for a test); exit 0
    /// and these lines.
    Instead(&'static str, &'static [&'static str]),
    /// Not run here, for this reason.
    Skip(&'static str),
}

use Action::*;

/// Every command line of the README's `sh` blocks (continuations joined, the trailing comment
/// dropped, synopsis brackets removed and `a|b` alternatives cut to the first: see
/// [`normalize`]), and what to do with it.
const EXAMPLES: &[(&str, Action)] = &[
    // Set up.
    (
        r#"cargo build --release && ./target/release/ppl eval --model "$(./target/release/ppl fetch-model)" --data wikitext-2 --ctx 512 --chunks 40"#,
        Instead(
            r#"ppl eval --model "$(ppl fetch-model)" --data wikitext-2 --ctx 512 --chunks 40"#,
            &["Final estimate: PPL = "],
        ),
    ),
    ("cargo test --release --features mpi", Skip("this test runs inside it")),
    // Models and data by name (the world's stand-in hub serves them).
    (
        "ppl eval --model hf:unsloth/Qwen3-0.6B-GGUF:Q4_K_M --data wikitext-2",
        Run,
    ),
    (
        "ppl eval --model hf:Qwen/Qwen2.5-0.5B --data wikitext-2 --task gptq",
        Run,
    ),
    ("ppl data list", Expect(0, &["wikitext-2", "allenai/c4"])),
    // Commands.
    ("ppl eval --model M.gguf --data text.txt", Run),
    (
        r#"ppl tokenize --model M.gguf --text "Hello world""#,
        Expect(0, &["19556 905"]),
    ),
    ("ppl fetch-model", Expect(0, &["SmolLM2-135M-Instruct.Q4_1.gguf"])),
    ("ppl runs", Expect(0, &["run(s) under", "complete"])),
    ("ppl inspect M.gguf", Expect(0, &["architecture  llama", "Q4_1"])),
    ("ppl models", Expect(0, &["SmolLM2-135M-Instruct.Q4_1.gguf"])),
    ("ppl bench", Expect(0, &["ppl"])),
    (
        "ppl launch --nproc-per-node N -- eval …",
        Instead(
            "ppl launch --nproc-per-node 2 --dry-run -- eval -m M.gguf -f text.txt",
            &["mpirun"],
        ),
    ),
    (
        "ppl validate",
        Instead(
            "ppl validate -m M.gguf -f text.txt",
            &["PASS", "configuration", "memory"],
        ),
    ),
    (
        "ppl config show --config F",
        Instead(
            "PPL_MODEL=M.gguf ppl config show --config configs/single.yaml",
            &["model:", "precision: f32"],
        ),
    ),
    (
        "ppl eval -m M.gguf -f text.txt --ranks 2 --cp 2 --ctx 8192 --precision f32",
        Instead(
            "ppl eval -m M.gguf -f text.txt --ranks 2 --cp 2 --ctx 256 --chunks 2 --precision f32",
            &["Final estimate: PPL = "],
        ),
    ),
    ("ppl report results.json", Run),
    (
        "ppl report base.json quant.json --format md",
        Expect(0, &["| run |", "quant.json"]),
    ),
    ("ppl compare --base B.gguf --model M.gguf --data text.txt", Run),
    ("ppl export M.gguf --dtype f32 -o F.gguf", Run),
    ("ppl export M.gguf --dtype bf16 --format safetensors -o DIR", Run),
    ("ppl quantize IN.gguf OUT.gguf --type q4_0", Run),
    (
        "ppl synth --shape llama3.2-1b --type q4_k_m --tokenizer-from T.gguf -o F.gguf",
        Instead(
            "ppl synth --shape smollm2-135m --type q4_k_m --tokenizer-from T.gguf -o F-synth.gguf",
            &["wrote"],
        ),
    ),
    // Eval.
    (
        "ppl eval -m SmolLM2-135M-Instruct.Q4_1.gguf -f wiki.test.raw --chunks 40 --precision f32 --batch-size 4 --output results.json",
        Run,
    ),
    (
        "ppl eval -m SmolLM2-135M-Instruct.Q4_1.gguf -f wiki.test.raw --chunks 2 --print-chunks --quiet",
        // The README's figures are at the default ctx 512, on WikiText-2's first windows.
        Instead(
            "PPL_NO_SHRINK=1 ppl eval -m SmolLM2-135M-Instruct.Q4_1.gguf -f ../shared/data/wikitext-2-raw/wiki.test.raw --chunks 2 --print-chunks --quiet",
            &["[1]12.8344,[2]21.6891,"],
        ),
    ),
    (
        "PPL_MODEL=$(ppl fetch-model) ppl eval --config configs/single.yaml --set evaluation.batch_size=8",
        Run,
    ),
    (
        "PPL_MODEL=$(ppl fetch-model) ppl config show --config configs/dp-2node.yaml",
        Expect(0, &["dp_replicate: 2", "schedule: dynamic"]),
    ),
    // lm-eval's wikitext task.
    (
        "ppl eval --model M --data wiki.test.raw --task wikitext",
        Expect(0, &["word_perplexity", "bits_per_byte"]),
    ),
    (
        "ppl eval --model M --data test-00000-of-00001.parquet --text-field page --task wikitext",
        Skip("the Hugging Face parquet file of the split is not among the test data"),
    ),
    // MPI.
    (
        "apt-get install libopenmpi-dev openmpi-bin libclang-dev",
        Skip("installs system packages (CI's .ci/run does)"),
    ),
    (
        "cargo build --release --features mpi",
        Skip("the build this test belongs to"),
    ),
    (
        "mpirun -np 4 ./target/release/ppl eval --model M.gguf --data text.txt --schedule dynamic",
        Run,
    ),
    (
        "srun -n 4 ./target/release/ppl eval …",
        Skip("needs Slurm: tests/slurm.rs runs ppl under srun"),
    ),
    (
        "./target/release/ppl launch --nproc-per-node 2 --hosts node1,node2 -- eval --model M.gguf --data text.txt",
        Instead(
            "ppl launch --nproc-per-node 2 --hosts node1,node2 --dry-run -- eval --model M.gguf --data text.txt",
            &["mpirun", "node1", "node2"],
        ),
    ),
    // Hosts on one machine.
    ("scripts/cluster.sh up 2 --mem 500M", Skip(CLUSTER)),
    ("export PPL_BIN=$PWD/target/release/ppl", Skip(CLUSTER)),
    (
        "scripts/cluster.sh exec 1 -- $PPL_BIN eval -m M.gguf -f wiki.test.raw --ctx 128 --precision f32",
        Skip(CLUSTER),
    ),
    (
        "scripts/cluster.sh launch -- eval -m M.gguf -f wiki.test.raw --ctx 128 --precision f32 --pp 2",
        Skip(CLUSTER),
    ),
    (
        "scripts/cluster.sh launch --hosts 2 --per-host 2 -- eval … --dp-replicate 2 --pp 2",
        Skip(CLUSTER),
    ),
    ("scripts/cluster.sh cut 2; scripts/cluster.sh heal", Skip(CLUSTER)),
    ("scripts/cluster.sh kill 2", Skip(CLUSTER)),
    ("scripts/cluster.sh slow 2 20ms 100mbit", Skip(CLUSTER)),
    ("scripts/cluster.sh peak 2; scripts/cluster.sh down", Skip(CLUSTER)),
    // Quantization and compare.
    (
        "ppl compare --base M.gguf --model M.gguf --quantize int4 --group-size 64 -f wiki.test.raw --chunks 40",
        Run,
    ),
    (
        "ppl compare --base M.gguf --model M.gguf -f wiki.test.raw --chunks 40 --save-base base.pplbase",
        Run,
    ),
    (
        "ppl compare --base-logits base.pplbase --model M.gguf --quantize q4_0 -f wiki.test.raw --chunks 40",
        Run,
    ),
    // Resume.
    (
        "ppl eval -m M.gguf -f wiki.test.raw --run-dir runs/wiki -o results.json",
        Run,
    ),
    ("ppl eval --resume runs/wiki -o results.json", Run),
    ("ppl eval --resume runs/wiki --ranks 4 --schedule dynamic", Run),
    (
        "ppl compare --base B.gguf -m M.gguf --quantize int4 -f wiki.test.raw --run-dir runs/cmp",
        Run,
    ),
    ("ppl compare --resume runs/cmp --ranks 4", Run),
    // Fuzzing.
    ("cargo install cargo-fuzz", Skip(FUZZ)),
    (
        "cargo +nightly fuzz run gguf fuzz/corpus/gguf fuzz/seeds/gguf -- -max_total_time=600 -max_len=262144",
        Skip(FUZZ),
    ),
    // GPUs.
    ("source .ci/cuda-env", Skip("installs the CUDA toolkit from PyPI (CI does)")),
    (
        "cargo build --release --features cuda",
        Skip("a CUDA build (CI compiles it; tests/device.rs runs it on a GPU)"),
    ),
    (
        "./target/release/ppl eval -m M.gguf --device cuda --precision f32 -f wiki.test.raw",
        Expect(1, &["--device cuda", "without CUDA support"]),
    ),
    // Hugging Face checkpoints.
    (
        "ppl export model.gguf --dtype bf16 --format safetensors --shard-size 2048 -o model-hf/",
        Run,
    ),
    ("ppl inspect model-hf/", Expect(0, &["Hugging Face checkpoint"])),
    ("ppl eval --model model-hf/ --data wiki.test.raw --ctx 512", Run),
    // Synthetic models.
    ("T=$(ppl fetch-model)", Run),
    (
        r#"ppl synth --shape llama3.1-8b --type q4_k_m --tokenizer-from "$T" -o 8b.gguf --seed 1"#,
        Instead(
            r#"ppl synth --shape smollm2-135m --type q4_k_m --tokenizer-from "$T" -o 8b.gguf --seed 1"#,
            &["wrote"],
        ),
    ),
    (
        r#"ppl synth --shape qwen2.5-7b --format safetensors --tokenizer-from "$T" -o qwen-hf/"#,
        Skip("a 15 GB BF16 checkpoint; tests/synth.rs writes the same form at small shapes"),
    ),
    (
        r#"ppl synth --shape custom --hidden 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 --family gemma3 --type q8_0 --tokenizer-from "$T" -o tiny.gguf"#,
        Run,
    ),
    // Benchmarks.
    ("scripts/bench-matrix.sh --list", Skip(BENCH)),
    (
        "scripts/bench-matrix.sh --llama-perplexity BIN --out matrix.md",
        Skip(BENCH),
    ),
    (
        "scripts/bench-matrix.sh --filter 'llama3.2-1b/(q8_0|q4_k_m)' --threads 1,2 --repeat 3 --llama-perplexity BIN",
        Skip(BENCH),
    ),
];

const CLUSTER: &str = "needs root and network namespaces: tests/cluster.rs runs these";
const FUZZ: &str = "nightly Rust and cargo-fuzz";
const BENCH: &str = "a benchmark (minutes to hours), not a test";

/// Checks of a command run without stated ones, by subcommand.
fn default_checks(cmd: &str) -> &'static [&'static str] {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let sub = words
        .iter()
        .position(|w| w.ends_with("ppl"))
        .and_then(|i| words.get(i + 1))
        .copied()
        .unwrap_or("");
    match sub {
        "eval" => &["Final estimate: PPL = "],
        "compare" => &["KLD"],
        "report" => &["wrote"],
        "export" | "quantize" | "synth" => &["wrote"],
        _ => &[],
    }
}

/// A README line as the table keys it: whitespace collapsed, synopsis brackets (`[--json]`)
/// removed, `a|b|c` alternatives cut to the first.
fn normalize(line: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in line.chars() {
        match c {
            '[' if !out.ends_with('$') => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace()
        .map(|w| {
            let plain = w
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-|".contains(c));
            if plain && w.contains('|') {
                w.split('|').next().unwrap_or(w)
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command lines of the README's `sh` blocks, block by block.
fn readme_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    let mut pending = String::new();
    for line in readme.lines() {
        if let Some(lines) = current.as_mut() {
            if line.trim_start().starts_with("```") {
                blocks.push(current.take().unwrap_or_default());
                continue;
            }
            let line = line.trim();
            if let Some(start) = line.strip_suffix('\\') {
                pending.push_str(start);
                pending.push(' ');
                continue;
            }
            let whole = std::mem::take(&mut pending) + line;
            let code = strip_comment(&whole);
            if !code.is_empty() {
                lines.push(normalize(code));
            }
        } else if line.trim_start() == "```sh" {
            current = Some(Vec::new());
        }
    }
    blocks
}

/// The line without a trailing `# comment` (a `#` after whitespace, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'#' if !single && !double && (i == 0 || bytes[i - 1].is_ascii_whitespace()) => {
                return line[..i].trim();
            }
            _ => {}
        }
    }
    line.trim()
}

/// The scratch world the examples run in: the README's file names, a `ppl` on PATH that
/// shrinks evaluations, and ppl's state directory inside it.
struct World {
    root: PathBuf,
    work: PathBuf,
    path: String,
    /// The stand-in hub the examples' names are fetched from (`HF_ENDPOINT`).
    hub: HubServer,
}

/// A stand-in for the Hugging Face Hub with what the README names: WikiText-2's test split
/// (the slice's rows, as the dataset stores them), a GGUF repository and a checkpoint
/// repository (both the test model: a GGUF file and its bf16 safetensors export).
fn stand_in_hub(text: &str, model: &Path, scratch: &Path) -> HubServer {
    let parquet = scratch.join("test.parquet");
    let rows: Vec<Option<String>> = common::wikitext_rows(text).into_iter().map(Some).collect();
    common::write_parquet(&parquet, &rows, 1000);
    let ckpt = scratch.join("ckpt");
    let ok = Command::new(env!("CARGO_BIN_EXE_ppl"))
        .arg("export")
        .arg(model)
        .args(["--dtype", "bf16", "--format", "safetensors", "-o"])
        .arg(&ckpt)
        .status()
        .unwrap();
    assert!(ok.success(), "exporting the stand-in checkpoint");
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    HubServer::start(vec![
        Repo::new(
            "datasets",
            "Salesforce/wikitext",
            vec![(
                "wikitext-2-raw-v1/test-00000-of-00001.parquet".into(),
                std::fs::read(&parquet).unwrap(),
            )],
        ),
        Repo::new(
            "models",
            "unsloth/Qwen3-0.6B-GGUF",
            vec![(
                "Qwen3-0.6B-Q4_K_M.gguf".into(),
                std::fs::read(model).unwrap(),
            )],
        ),
        Repo::new("models", "Qwen/Qwen2.5-0.5B", files),
    ])
}

/// `ppl` as the examples call it: the real binary, evaluations shrunk to two 64-token windows
/// (a flag the example gives is replaced, so a resumed run still matches its first part).
const WRAPPER: &str = r#"#!/usr/bin/env bash
case "${PPL_NO_SHRINK:-}:$1" in
  :eval|:compare|:validate|:bench)
    args=(); skip=0
    for a in "$@"; do
      if [ "$skip" = 1 ]; then skip=0; continue; fi
      case "$a" in
        --ctx|--chunks) skip=1; continue ;;
        --ctx=*|--chunks=*) continue ;;
      esac
      args+=("$a")
    done
    exec "$PPL_REAL_BIN" "${args[@]}" --ctx 64 --chunks 2 ;;
  *) exec "$PPL_REAL_BIN" "$@" ;;
esac
"#;

fn world() -> World {
    let root = std::env::temp_dir().join(format!("ppl-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let work = root.join("work");
    let bin = root.join("bin");
    let shared = root.join("shared/data/wikitext-2-raw");
    for d in [&work, &bin, &shared, &work.join("configs")] {
        std::fs::create_dir_all(d).unwrap();
    }
    // A slice of WikiText-2 (whole lines): enough for a few 64-token windows, quick to read.
    let text = std::fs::read_to_string(common::wikitext()).unwrap();
    let cut = text[..60_000].rfind('\n').unwrap_or(60_000) + 1;
    let text = &text[..cut];
    std::fs::write(shared.join("wiki.test.raw"), text).unwrap();
    for name in ["text.txt", "wiki.test.raw"] {
        std::fs::write(work.join(name), text).unwrap();
    }
    let model = common::model();
    for name in [
        "M",
        "M.gguf",
        "B.gguf",
        "IN.gguf",
        "T.gguf",
        "model.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ] {
        std::os::unix::fs::symlink(&model, work.join(name)).unwrap();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for e in std::fs::read_dir(repo.join("configs")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, work.join("configs").join(p.file_name().unwrap())).unwrap();
    }
    let wrapper = bin.join("ppl");
    std::fs::write(&wrapper, WRAPPER).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hub = stand_in_hub(text, &model, &root);
    let w = World {
        root,
        work,
        path,
        hub,
    };
    // The results files the report examples read.
    for (out, extra) in [
        ("base.json", ""),
        ("quant.json", " --quantize q4_0"),
        ("results.json", ""),
    ] {
        let (code, text) = w.run(&format!("ppl eval -m M.gguf -f text.txt -o {out}{extra}"));
        assert_eq!(code, 0, "setting up {out}: {text}");
    }
    w
}

impl World {
    /// Runs one shell command line in the scratch directory: (exit code, stdout + stderr).
    fn run(&self, line: &str) -> (i32, String) {
        self.run_script(&[line.to_string()])
            .pop()
            .unwrap_or((-1, String::new()))
    }

    /// Runs a block's lines in one shell (variables set by one line serve the next), each
    /// bounded in time: per line (exit code, stdout + stderr).
    fn run_script(&self, lines: &[String]) -> Vec<(i32, String)> {
        let out = self.root.join("out");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let mut script = String::from("set +e\n");
        for (i, line) in lines.iter().enumerate() {
            let line = line.replace("./target/release/ppl", "ppl");
            script += &format!(
                "{{ {line}\n}} >{0}/{i}.txt 2>&1 </dev/null; echo $? >{0}/{i}.rc\n",
                out.display()
            );
        }
        let status = Command::new("timeout")
            .args(["600", "bash", "-c", &script])
            .current_dir(&self.work)
            .env("PATH", &self.path)
            .env("PPL_REAL_BIN", env!("CARGO_BIN_EXE_ppl"))
            .env("PPL_STATE_DIR", self.root.join("state"))
            .env("HF_ENDPOINT", &self.hub.endpoint)
            .env("HF_HUB_CACHE", self.root.join("hub"))
            .env("HF_HOME", self.root.join("hf-home"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .env_remove("PPL_MODEL")
            .status()
            .expect("bash runs");
        assert!(status.success(), "a README block ran past 600 s");
        (0..lines.len())
            .map(|i| {
                let rc = std::fs::read_to_string(out.join(format!("{i}.rc")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(-1);
                let text =
                    std::fs::read_to_string(out.join(format!("{i}.txt"))).unwrap_or_default();
                (rc, text)
            })
            .collect()
    }
}

#[test]
fn every_readme_command_is_listed_and_every_entry_is_in_the_readme() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let lines: BTreeSet<String> = readme_blocks(&readme).into_iter().flatten().collect();
    let listed: BTreeSet<String> = EXAMPLES.iter().map(|(l, _)| normalize(l)).collect();
    let unlisted: Vec<_> = lines.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&lines).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "README commands not in tests/readme.rs's EXAMPLES (add each with how to check it): {unlisted:#?}\n\
         EXAMPLES entries no longer in the README (update or remove them): {stale:#?}"
    );
}

#[test]
fn readme_examples_run_as_documented() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let w = world();
    let (mut ran, mut skipped, mut failures) = (0, Vec::new(), Vec::new());
    for block in readme_blocks(&readme) {
        let mut to_run = Vec::new();
        let mut checks = Vec::new();
        for line in &block {
            let Some((_, action)) = EXAMPLES.iter().find(|(l, _)| normalize(l) == *line) else {
                // The listing test names it.
                continue;
            };
            let mpi_missing = line.starts_with("mpirun") && !cfg!(feature = "mpi");
            let gpu_build = line.contains("--device cuda") && cfg!(feature = "cuda");
            let (cmd, code, expect) = match *action {
                Skip(why) => {
                    skipped.push(format!("{line}: {why}"));
                    continue;
                }
                _ if mpi_missing => {
                    skipped.push(format!("{line}: a build without the mpi feature"));
                    continue;
                }
                _ if gpu_build => {
                    skipped.push(format!(
                        "{line}: a CUDA build runs it on a GPU (tests/device.rs)"
                    ));
                    continue;
                }
                Run => (line.clone(), 0, default_checks(line)),
                Expect(code, lines) => (line.clone(), code, lines),
                Instead(cmd, lines) => (cmd.to_string(), 0, lines),
            };
            to_run.push(cmd.clone());
            checks.push((line.clone(), cmd, code, expect));
        }
        if to_run.is_empty() {
            continue;
        }
        for ((line, cmd, code, expect), (got, text)) in checks.iter().zip(w.run_script(&to_run)) {
            ran += 1;
            let missing: Vec<_> = expect.iter().filter(|e| !text.contains(*e)).collect();
            if got != *code || !missing.is_empty() {
                failures.push(format!(
                    "README: {line}\nran: {cmd}\nexit {got} (expected {code}); missing {missing:?}\n--- output ---\n{}",
                    text.chars().take(3000).collect::<String>()
                ));
            }
        }
    }
    let summary = format!(
        "README examples: {ran} run, {} failed, {} skipped:\n  {}\n",
        failures.len(),
        skipped.len(),
        skipped.join("\n  ")
    );
    eprint!("{summary}");
    // CI prints it after the suite (a passing test's output is not shown).
    let _ = std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-examples.txt"),
        &summary,
    );
    assert!(
        failures.is_empty(),
        "{} README example(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(ran >= 30, "only {ran} README examples ran");
    let _ = std::fs::remove_dir_all(&w.root);
}

#[test]
fn readme_lines_normalize_as_the_table_keys_them() {
    assert_eq!(
        normalize("ppl inspect M.gguf [--json]"),
        "ppl inspect M.gguf"
    );
    assert_eq!(
        normalize("ppl quantize IN.gguf OUT.gguf --type q4_0|q4_1|q8_0"),
        "ppl quantize IN.gguf OUT.gguf --type q4_0"
    );
    assert_eq!(
        normalize("scripts/bench-matrix.sh --filter 'llama3.2-1b/(q8_0|q4_k_m)'"),
        "scripts/bench-matrix.sh --filter 'llama3.2-1b/(q8_0|q4_k_m)'"
    );
    assert_eq!(
        strip_comment("ppl models   # the cached models"),
        "ppl models"
    );
    assert_eq!(
        strip_comment("echo '# not a comment'"),
        "echo '# not a comment'"
    );
}

#[test]
fn every_test_file_is_in_exactly_one_of_the_quick_and_long_aliases() {
    // `cargo test-quick` and `cargo test-long` (.cargo/config.toml) split the README's test
    // command; a test file in neither would be run by CI but by neither half.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
    let alias = |name: &str| -> BTreeSet<String> {
        let start = config.find(&format!("{name} = [")).unwrap();
        let body = &config[start..start + config[start..].find(']').unwrap()];
        let words: Vec<&str> = body.split('"').skip(1).step_by(2).collect();
        words
            .windows(2)
            .filter(|w| w[0] == "--test")
            .map(|w| w[1].to_string())
            .collect()
    };
    let (quick, long) = (alias("test-quick"), alias("test-long"));
    assert!(quick.len() > 10 && long.len() > 10, "{quick:?} {long:?}");
    assert!(quick.is_disjoint(&long), "{:?}", quick.intersection(&long));
    let files: BTreeSet<String> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    let both: BTreeSet<String> = quick.union(&long).cloned().collect();
    assert_eq!(both, files, "tests/*.rs against test-quick + test-long");
}
