//! Datasets by name (`--data wikitext-2`, `ptb`, `c4`) from a local stand-in for the Hugging
//! Face Hub serving the dataset repositories' files, and the GPTQ reference code's protocol
//! (`--task gptq`) against that code's figures computed with transformers in float32
//! (`scripts/gptq-reference.py`, committed under tests/fixtures).
//!
//! `wikitext-2` is the dataset's rows concatenated, which is `wiki.test.raw` byte for byte
//! (checked by its SHA-256); the rows are laid out from `../shared`'s file as the repository
//! stores them ([`common::wikitext_rows`]).

mod common;

use std::path::Path;

use common::hub_server::{HubServer, Repo};
use common::{
    assert_same_numbers, eval_model, eval_with, fails, model, ppl_cmd, wikitext, wikitext_rows,
    write_parquet,
};
use ppl::report::Results;

/// SHA-256 of `../shared/data/wikitext-2-raw/wiki.test.raw` (its README states it).
const WIKI_TEST_RAW_SHA256: &str =
    "bbf94c53a05abe9ee670d3b6343608095822c85e26de37c70b24fc571964574a";

fn parquet_bytes(rows: &[String]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.parquet");
    let opt: Vec<Option<String>> = rows.iter().cloned().map(Some).collect();
    write_parquet(&p, &opt, 1000);
    std::fs::read(p).unwrap()
}

fn wikitext_server() -> HubServer {
    let raw = std::fs::read_to_string(wikitext()).unwrap();
    let rows = wikitext_rows(&raw);
    let test = parquet_bytes(&rows);
    HubServer::start(vec![Repo::new(
        "datasets",
        "Salesforce/wikitext",
        vec![
            ("README.md".into(), b"# wikitext\n".to_vec()),
            ("wikitext-2-raw-v1/test-00000-of-00001.parquet".into(), test),
        ],
    )])
}

struct Env {
    cache: tempfile::TempDir,
    ppl_cache: tempfile::TempDir,
    endpoint: String,
}

impl Env {
    fn new(endpoint: &str) -> Self {
        Self {
            cache: tempfile::tempdir().unwrap(),
            ppl_cache: tempfile::tempdir().unwrap(),
            endpoint: endpoint.to_string(),
        }
    }

    fn cmd(&self) -> assert_cmd::Command {
        let mut c = ppl_cmd();
        c.env("HF_HUB_CACHE", self.cache.path())
            .env("HF_HOME", self.cache.path().join("home"))
            .env("HF_ENDPOINT", &self.endpoint)
            .env("PPL_CACHE_DIR", self.ppl_cache.path())
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
        c
    }

    fn eval(&self, model: &Path, args: &[&str]) -> Results {
        let mut c = self.cmd();
        c.arg("eval").arg("--model").arg(model).args(args);
        eval_with(c)
    }

    fn fails(&self, args: &[&str]) -> String {
        fails(&mut self.cmd(), args)
    }
}

#[test]
fn the_rows_laid_out_are_the_datasets_and_join_to_the_file() {
    let raw = std::fs::read_to_string(wikitext()).unwrap();
    let rows = wikitext_rows(&raw);
    assert_eq!(rows.len(), 4358, "the test split has 4,358 rows");
    assert_eq!(&rows[..3], ["", " = Robert Boulter = \n", ""]);
    assert_eq!(rows.concat(), raw);
    // GPTQ's join of the first rows, as its users print it.
    assert!(rows
        .join("\n\n")
        .starts_with("\n\n = Robert Boulter = \n\n\n\n\n Robert Boulter is"));
}

#[test]
fn wikitext_2_by_name_is_wiki_test_raw_byte_for_byte() {
    let server = wikitext_server();
    let env = Env::new(&server.endpoint);
    let args = ["--ctx", "128", "--chunks", "3", "--threads", "2"];
    let r = env.eval(&model(), &[&["--data", "wikitext-2"][..], &args].concat());
    assert_eq!(r.data.sha256, WIKI_TEST_RAW_SHA256);
    let file = eval_model(&model(), &args);
    assert_eq!(file.data.sha256, WIKI_TEST_RAW_SHA256);
    assert_same_numbers(&file, &r);
    let source = r.data.source.expect("data.source in results.json");
    assert_eq!(source.name, "wikitext-2:test");
    assert_eq!(source.repo, "Salesforce/wikitext");
    assert_eq!(source.commit.len(), 40);
    assert_eq!(
        source.files,
        ["wikitext-2-raw-v1/test-00000-of-00001.parquet"]
    );
    // Again, offline: from the caches, no server needed.
    let offline = Env {
        endpoint: "http://127.0.0.1:9".into(),
        ..env
    };
    let again = offline.eval(&model(), &[&["--data", "wikitext-2"][..], &args].concat());
    assert_same_numbers(&file, &again);
}

#[test]
fn unknown_names_splits_and_uncached_data_say_what_exists() {
    let server = wikitext_server();
    let env = Env::new(&server.endpoint);
    let m = model();
    let m = m.to_str().unwrap();
    let e = env.fails(&["eval", "--model", m, "--data", "wikitext2"]);
    assert!(
        e.contains("not a dataset name") && e.contains("wikitext-2") && e.contains("c4"),
        "{e}"
    );
    let e = env.fails(&[
        "eval",
        "--model",
        m,
        "--data",
        "wikitext-2",
        "--task",
        "gptq",
        "--method",
        "chunks",
    ]);
    assert!(
        e.contains("--task gptq scores with disjoint windows"),
        "{e}"
    );
    let e = env.fails(&["eval", "--model", m, "--data", "wikitext-2:dev"]);
    assert!(
        e.contains("no split 'dev'") && e.contains("test, validation, train"),
        "{e}"
    );
    // The stand-in holds only the test split.
    let e = env.fails(&["eval", "--model", m, "--data", "wikitext-2:validation"]);
    assert!(
        e.contains(
            "validation-00000-of-00001.parquet' is not in dataset repository 'Salesforce/wikitext'"
        ),
        "{e}"
    );
    let e = env.fails(&["eval", "--model", m, "--data", "ptb"]);
    assert!(
        e.contains("dataset repository 'ptb-text-only/ptb_text_only' was not found"),
        "{e}"
    );
    let mut offline = env.cmd();
    offline.env("HF_HUB_OFFLINE", "1");
    let o = offline
        .args(["eval", "--model", m, "--data", "wikitext-2"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("HF_HUB_OFFLINE is set"),
        "{e}"
    );
    env.cmd()
        .args(["data", "list"])
        .assert()
        .success()
        .stdout(predicates::str::contains("wikitext-2"))
        .stdout(predicates::str::contains("Salesforce/wikitext"))
        .stdout(predicates::str::contains("allenai/c4"));
}

/// Per-window figures of the GPTQ reference code (transformers, float32) in a fixture.
struct Reference {
    ppl: f64,
    tokens: usize,
    windows: usize,
    window_nll: Vec<f64>,
}

fn reference(name: &str) -> Reference {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    Reference {
        ppl: j["ppl"].as_f64().unwrap(),
        tokens: j["tokens"].as_u64().unwrap() as usize,
        windows: j["nsamples"].as_u64().unwrap() as usize,
        window_nll: j["window_nll_f64"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect(),
    }
}

fn assert_windows_match(r: &Results, reference: &Reference, tol: f64) {
    assert_eq!(
        r.windows.len(),
        reference.window_nll.len().min(r.windows.len())
    );
    for (w, want) in r.windows.iter().zip(&reference.window_nll) {
        let got = w.nll_sum;
        assert!(
            ((got - want) / want).abs() < tol,
            "window {}: ppl {got} vs transformers {want}",
            w.index
        );
    }
}

/// `--task gptq` on WikiText-2 (its rows joined by "\n\n", disjoint windows, every token
/// after each window's first scored) against the GPTQ reference code run with transformers
/// in float32 on the same model (the SmolLM2 test model dequantized to f32).
#[test]
fn gptq_protocol_matches_the_reference_code_on_wikitext_2() {
    let server = wikitext_server();
    let env = Env::new(&server.endpoint);
    let reference = reference("gptq-wikitext2-512.json");
    let r = env.eval(
        &model(),
        &[
            "--data",
            "wikitext-2",
            "--task",
            "gptq",
            "--ctx",
            "512",
            "--chunks",
            "8",
            "--precision",
            "f32",
            "--threads",
            "2",
        ],
    );
    assert_eq!(r.windows.len(), 8);
    assert!(r
        .windows
        .iter()
        .all(|w| w.input_tokens == 512 && w.tokens == 511));
    assert_windows_match(&r, &reference, 1e-5);
    let raw = std::fs::read_to_string(wikitext()).unwrap();
    let joined = wikitext_rows(&raw).join("\n\n");
    assert_eq!(r.data.sha256, ppl::sha256::of_bytes(joined.as_bytes()));
    let ppl8: f64 = (reference.window_nll[..8].iter().sum::<f64>() / (8.0 * 511.0)).exp();
    assert!(((r.ppl - ppl8) / ppl8).abs() < 1e-5, "{} vs {ppl8}", r.ppl);
    // The whole split is cut into the reference's windows (the remainder dropped).
    let cfg = &r.config;
    assert_eq!(cfg["task"]["name"], "gptq");
    assert_eq!(reference.tokens / 512, reference.windows);
    assert!(reference.ppl > 1.0);
}

/// C4 as GPTQ's `c4_new` takes it: the first 1,100 documents of the validation shard joined
/// by spaces, at most 256 windows; a C4-shaped fixture (C4 itself is not served here).
#[test]
fn gptq_protocol_takes_c4_as_the_reference_code_does() {
    let gz = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/c4-fixture.jsonl.gz"),
    )
    .unwrap();
    let server = HubServer::start(vec![Repo::new(
        "datasets",
        "allenai/c4",
        vec![("en/c4-validation.00000-of-00008.json.gz".into(), gz.clone())],
    )]);
    let env = Env::new(&server.endpoint);
    let reference = reference("gptq-c4fixture-256.json");
    let r = env.eval(
        &model(),
        &[
            "--data",
            "c4",
            "--task",
            "gptq",
            "--ctx",
            "256",
            "--precision",
            "f32",
            "--threads",
            "2",
            "--chunks",
            "6",
        ],
    );
    assert_windows_match(&r, &reference, 1e-5);
    // The text is the first 1,100 of the fixture's 1,200 documents joined by spaces.
    let mut json = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut json).unwrap();
    let docs: Vec<String> = json
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(docs.len(), 1200);
    let text = docs[..1100].join(" ");
    assert_eq!(r.data.sha256, ppl::sha256::of_bytes(text.as_bytes()));
    // Without --task: the documents themselves (rolling sees each one).
    let docs = env.eval(
        &model(),
        &[
            "--data", "c4", "--method", "rolling", "--ctx", "128", "--chunks", "3",
        ],
    );
    assert_eq!(docs.data.documents, Some(3));
}
