//! Data sources: a JSON Lines file, a Parquet file (and a directory of Parquet shards), a
//! directory of text files and standard input give exactly
//! the result of the equivalent text file (rolling per document, chunks over the documents
//! joined by a blank line); malformed records name the line and the fix.

mod common;

use std::path::Path;

use common::{assert_same_numbers, ppl_cmd, write_parquet};
use ppl::report::Results;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

/// Three short wikitext articles: a title line and one paragraph of the real text each.
fn articles() -> Vec<String> {
    let text = std::fs::read_to_string(common::wikitext()).unwrap();
    let paragraphs: Vec<&str> = text
        .lines()
        .filter(|l| l.len() > 150 && l.len() < 300)
        .take(3)
        .collect();
    assert_eq!(paragraphs.len(), 3);
    paragraphs
        .iter()
        .enumerate()
        .map(|(i, p)| format!(" = Article {i} = \n{p}\n"))
        .collect()
}

fn run(data: &Path, extra: &[&str], stdin: Option<&[u8]>) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let mut cmd = ppl_cmd();
    cmd.arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(data)
        .args(["--ctx", "32", "--progress", "none", "--quiet", "--output"])
        .arg(&out)
        .args(extra);
    if let Some(bytes) = stdin {
        cmd.write_stdin(bytes.to_vec());
    }
    cmd.assert().success();
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

fn jsonl(docs: &[String], field: &str) -> String {
    docs.iter()
        .map(|d| serde_json::json!({ "id": 7, field: d }).to_string() + "\n")
        .collect()
}

#[test]
fn jsonl_a_directory_and_stdin_equal_the_text_file() {
    let docs = articles();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    // Rolling: the records are the documents the text file splits into.
    std::fs::write(p("articles.txt"), docs.concat()).unwrap();
    std::fs::write(p("articles.jsonl"), jsonl(&docs, "body")).unwrap();
    std::fs::create_dir(p("articles")).unwrap();
    for (i, d) in docs.iter().enumerate() {
        std::fs::write(p("articles").join(format!("{i:02}.txt")), d).unwrap();
    }
    let rolling = ["--method", "rolling"];
    let text = run(&p("articles.txt"), &rolling, None);
    assert_eq!(text.windows.iter().map(|w| w.group).max(), Some(2));
    let mut with_field = rolling.to_vec();
    with_field.extend(["--text-field", "body"]);
    let records = run(&p("articles.jsonl"), &with_field, None);
    assert_same_numbers(&text, &records);
    assert_eq!(text.word_perplexity, records.word_perplexity);
    assert!(text.word_perplexity.is_some());
    assert_eq!(text.byte_perplexity, records.byte_perplexity);
    assert_same_numbers(&text, &run(&p("articles"), &rolling, None));

    // Chunks: the documents joined by a blank line, as a text file would hold them.
    std::fs::write(p("joined.txt"), docs.join("\n\n")).unwrap();
    let chunks = ["--method", "chunks"];
    let joined = run(&p("joined.txt"), &chunks, None);
    assert!(joined.windows.len() >= 3);
    let mut with_field = chunks.to_vec();
    with_field.extend(["--text-field", "body"]);
    assert_same_numbers(&joined, &run(&p("articles.jsonl"), &with_field, None));
    assert_same_numbers(&joined, &run(&p("articles"), &chunks, None));

    // Standard input.
    let piped = run(Path::new("-"), &chunks, Some(docs.join("\n\n").as_bytes()));
    assert_same_numbers(&joined, &piped);
}

#[test]
fn parquet_files_and_shards_equal_the_text_file() {
    let docs = articles();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let mut rows: Vec<Option<String>> = docs.iter().cloned().map(Some).collect();
    rows.insert(1, None);
    rows.insert(3, Some(String::new()));
    write_parquet(&p("test.parquet"), &rows, 2);
    std::fs::create_dir(p("shards")).unwrap();
    write_parquet(&p("shards/test-00000-of-00002.parquet"), &rows[..2], 1);
    write_parquet(&p("shards/test-00001-of-00002.parquet"), &rows[2..], 3);
    std::fs::write(p("articles.txt"), docs.concat()).unwrap();
    std::fs::write(p("joined.txt"), docs.join("\n\n")).unwrap();

    let rolling = ["--method", "rolling"];
    let text = run(&p("articles.txt"), &rolling, None);
    assert_same_numbers(&text, &run(&p("test.parquet"), &rolling, None));
    assert_same_numbers(&text, &run(&p("shards"), &rolling, None));
    let chunks = ["--method", "chunks"];
    let joined = run(&p("joined.txt"), &chunks, None);
    assert_same_numbers(&joined, &run(&p("test.parquet"), &chunks, None));

    let fails = |data: &Path, extra: &[&str]| {
        let out = ppl_cmd()
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(data)
            .args(extra)
            .assert()
            .failure()
            .stderr(contains("panicked").not());
        String::from_utf8(out.get_output().stderr.clone()).unwrap()
    };
    let e = fails(&p("test.parquet"), &["--text-field", "body"]);
    assert!(
        e.contains("no column 'body' (the file has: text, id)") && e.contains("--text-field"),
        "{e}"
    );
    let e = fails(&p("test.parquet"), &["--text-field", "id"]);
    assert!(e.contains("column 'id' is not a string column"), "{e}");
    std::fs::write(p("fake.parquet"), "text, not parquet").unwrap();
    let e = fails(&p("fake.parquet"), &[]);
    assert!(
        e.contains("fake.parquet: not a readable Parquet file"),
        "{e}"
    );
}

#[test]
fn malformed_records_name_the_line_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.jsonl");
    let eval_fails = |content: &str| {
        std::fs::write(&f, content).unwrap();
        ppl_cmd()
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(&f)
            .assert()
            .failure()
            .stderr(contains("panicked").not())
    };
    eval_fails("{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n")
        .stderr(contains("d.jsonl, line 2"))
        .stderr(contains("no field 'text' (the record has: body)"))
        .stderr(contains("--text-field"));
    eval_fails("{\"text\": \"fine\"\n").stderr(contains("d.jsonl, line 1: not a JSON record"));
}
