//! Datasets by name (`--data wikitext-2`, `--data wikitext-2:validation`): the files of a
//! dataset repository on the Hugging Face Hub, fetched through the hub cache
//! ([`crate::hub`]), made into the text ppl evaluates by a join stated per dataset.
//!
//! | name | repository, files | text (`--data NAME`) | `--task gptq` text |
//! |---|---|---|---|
//! | `wikitext-2` | `Salesforce/wikitext`, `wikitext-2-raw-v1/{split}-00000-of-00001.parquet` | the rows concatenated (`"".join`): the raw split file (`wiki.test.raw`) byte for byte | `"\n\n".join(rows)` |
//! | `wikitext-103` | the same repository, `wikitext-103-raw-v1/…` | likewise | likewise |
//! | `ptb` | `ptb-text-only/ptb_text_only` (its Parquet conversion), column `sentence` | one sentence per line | `"\n\n".join(sentences)` |
//! | `c4` | `allenai/c4`, `en/c4-validation.00000-of-00008.json.gz` | its documents (JSON Lines) | the first 1,100 documents joined by `" "`, the first 256 windows |
//!
//! Splits: `wikitext-*` and `ptb` have `test` (the default), `validation` and `train`; `c4`
//! has `validation`. The derived text is written once into ppl's cache, named by the
//! dataset, split, join and the content hash of its first file, with a `.source.json` beside
//! it that results.json reports as `data.source`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::DataError;
use crate::hub::download::fetch_file;
use crate::hub::http::HubClient;
use crate::hub::{HubError, HubSettings, RepoKind};
use crate::task::Task;

/// How rows become the evaluated text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Join {
    /// The rows concatenated as stored (each row keeps its own newline).
    Concat,
    /// One row per line.
    Lines,
    /// `"\n\n".join(rows)`, as the GPTQ reference code joins WikiText-2 and PTB.
    BlankLine,
    /// Each record a document (JSON Lines).
    Documents,
    /// `" ".join(first 1,100 documents)`, as GPTQ's `c4_new` takes C4's validation shard.
    C4Gptq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileFormat {
    Parquet,
    JsonGz,
}

/// A dataset ppl knows by name.
#[derive(Debug, Clone, Copy)]
pub struct NamedDataset {
    pub name: &'static str,
    pub repo: &'static str,
    pub revision: &'static str,
    /// `(split, files)`; the first split is the default.
    splits: &'static [(&'static str, &'static [&'static str])],
    field: &'static str,
    format: FileFormat,
    join: Join,
    gptq_join: Join,
    /// At most this many windows under `--task gptq` (C4's 256).
    gptq_windows: Option<usize>,
    pub about: &'static str,
}

/// Every name `--data` knows.
pub const DATASETS: &[NamedDataset] = &[
    NamedDataset {
        name: "wikitext-2",
        repo: "Salesforce/wikitext",
        revision: "main",
        splits: &[
            ("test", &["wikitext-2-raw-v1/test-00000-of-00001.parquet"]),
            (
                "validation",
                &["wikitext-2-raw-v1/validation-00000-of-00001.parquet"],
            ),
            ("train", &["wikitext-2-raw-v1/train-00000-of-00001.parquet"]),
        ],
        field: "text",
        format: FileFormat::Parquet,
        join: Join::Concat,
        gptq_join: Join::BlankLine,
        gptq_windows: None,
        about: "WikiText-2 raw (wiki.test.raw for the test split)",
    },
    NamedDataset {
        name: "wikitext-103",
        repo: "Salesforce/wikitext",
        revision: "main",
        splits: &[
            ("test", &["wikitext-103-raw-v1/test-00000-of-00001.parquet"]),
            (
                "validation",
                &["wikitext-103-raw-v1/validation-00000-of-00001.parquet"],
            ),
            (
                "train",
                &[
                    "wikitext-103-raw-v1/train-00000-of-00002.parquet",
                    "wikitext-103-raw-v1/train-00001-of-00002.parquet",
                ],
            ),
        ],
        field: "text",
        format: FileFormat::Parquet,
        join: Join::Concat,
        gptq_join: Join::BlankLine,
        gptq_windows: None,
        about: "WikiText-103 raw (its test and validation splits are WikiText-2's)",
    },
    NamedDataset {
        name: "ptb",
        repo: "ptb-text-only/ptb_text_only",
        revision: "refs/convert/parquet",
        splits: &[
            ("test", &["penn_treebank/test/0000.parquet"]),
            ("validation", &["penn_treebank/validation/0000.parquet"]),
            ("train", &["penn_treebank/train/0000.parquet"]),
        ],
        field: "sentence",
        format: FileFormat::Parquet,
        join: Join::Lines,
        gptq_join: Join::BlankLine,
        gptq_windows: None,
        about: "Penn Treebank (Mikolov's text-only version)",
    },
    NamedDataset {
        name: "c4",
        repo: "allenai/c4",
        revision: "main",
        splits: &[("validation", &["en/c4-validation.00000-of-00008.json.gz"])],
        field: "text",
        format: FileFormat::JsonGz,
        join: Join::Documents,
        gptq_join: Join::C4Gptq,
        gptq_windows: Some(256),
        about: "C4 English, the first validation shard (356,317 documents)",
    },
];

/// Where a dataset text came from (results.json `data.source`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataOrigin {
    /// `wikitext-2:test`.
    pub name: String,
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<String>,
    pub join: Join,
}

impl DataOrigin {
    fn sidecar(text: &Path) -> PathBuf {
        let mut p = text.as_os_str().to_owned();
        p.push(".source.json");
        PathBuf::from(p)
    }

    /// The origin recorded beside a derived text, or `None` for any other file.
    pub fn of_path(text: &Path) -> Option<Self> {
        let s = std::fs::read_to_string(Self::sidecar(text)).ok()?;
        serde_json::from_str(&s).ok()
    }
}

/// A `--data` value resolved to a file.
#[derive(Debug, Clone)]
pub struct LocalData {
    pub path: PathBuf,
    /// The window cap the dataset's protocol sets (C4 under `--task gptq`).
    pub max_windows: Option<usize>,
}

/// `name` or `name:split` → the dataset and split, if `value` names one.
fn lookup(value: &str) -> Option<(&'static NamedDataset, Option<&str>)> {
    let (name, split) = match value.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (value, None),
    };
    DATASETS
        .iter()
        .find(|d| d.name.eq_ignore_ascii_case(name))
        .map(|d| (d, split))
}

/// Is `value` a dataset name (rather than a path)?
pub fn is_dataset_name(value: &str) -> bool {
    lookup(value).is_some()
}

/// The names and what they are, for `ppl data list` and error messages.
pub fn listing() -> String {
    let mut out = String::new();
    for d in DATASETS {
        let splits: Vec<&str> = d.splits.iter().map(|s| s.0).collect();
        out.push_str(&format!(
            "{:<14} {:<30} splits: {:<24} {}\n",
            d.name,
            d.repo,
            splits.join(", "),
            d.about
        ));
    }
    out
}

/// Did the user mean a name? A relative path that does not exist and has no extension nor
/// directory part, close to a known name.
fn looks_like_a_name(value: &str) -> bool {
    !value.contains('/') && !value.contains('.') && value != "-"
}

/// The file a `--data` value names: an existing path as it is; a dataset name fetched and
/// joined (for `task`'s protocol) into ppl's cache.
pub fn local_data(value: &Path, task: Option<Task>) -> Result<LocalData, DataError> {
    let plain = LocalData {
        path: value.to_path_buf(),
        max_windows: None,
    };
    let Some(s) = value.to_str() else {
        return Ok(plain);
    };
    if value.exists() {
        return Ok(plain);
    }
    let Some((d, split)) = lookup(s) else {
        if looks_like_a_name(s) && !s.is_empty() {
            return Err(DataError::Windows(format!(
                "--data {s}: no such file, and not a dataset name; the names are:\n{}(or give a path to a text, .jsonl or .parquet file)",
                listing()
            )));
        }
        return Ok(plain);
    };
    let split = split.unwrap_or(d.splits[0].0);
    let Some((_, files)) = d.splits.iter().find(|(n, _)| *n == split) else {
        let known: Vec<&str> = d.splits.iter().map(|s| s.0).collect();
        return Err(DataError::Windows(format!(
            "--data {s}: {} has no split '{split}'; its splits: {}",
            d.name,
            known.join(", ")
        )));
    };
    let gptq = task == Some(Task::Gptq);
    let join = if gptq { d.gptq_join } else { d.join };
    let path = materialize(d, split, files, join)
        .map_err(|e| DataError::Windows(format!("--data {s}: {e}")))?;
    Ok(LocalData {
        path,
        max_windows: if gptq { d.gptq_windows } else { None },
    })
}

/// Fetches the split's files and writes the joined text into ppl's cache (once per commit).
fn materialize(
    d: &NamedDataset,
    split: &str,
    files: &[&str],
    join: Join,
) -> Result<PathBuf, HubError> {
    let settings = HubSettings::from_env();
    let client = HubClient::new(&settings);
    let first = fetch_file(&client, RepoKind::Dataset, d.repo, d.revision, files[0])?;
    let mut local = vec![first.path.clone()];
    for f in &files[1..] {
        local.push(fetch_file(&client, RepoKind::Dataset, d.repo, &first.commit, f)?.path);
    }
    let ext = if join == Join::Documents {
        "jsonl"
    } else {
        "txt"
    };
    let join_name = serde_json::to_value(join)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    // Named by the content (the blob the snapshot links to: its hash), so a text is never
    // reused for other bytes.
    let content = std::fs::canonicalize(&first.path)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| first.commit.clone());
    let dir = crate::model::fetch::cache_dir().join("data");
    let out = dir.join(format!(
        "{}-{split}-{join_name}-{}.{ext}",
        d.name,
        &content[..16.min(content.len())]
    ));
    let origin = DataOrigin {
        name: format!("{}:{split}", d.name),
        repo: d.repo.to_string(),
        revision: d.revision.to_string(),
        commit: first.commit.clone(),
        files: files.iter().map(|f| f.to_string()).collect(),
        join,
    };
    if out.is_file() && DataOrigin::of_path(&out).as_ref() == Some(&origin) {
        return Ok(out);
    }
    let text = joined_text(d, &local, join).map_err(|e| HubError::Protocol {
        url: format!("{}/{}", d.repo, files[0]),
        why: e.to_string(),
    })?;
    crate::hub::cache::write_atomic(&out, text.as_bytes())?;
    let json = serde_json::to_string_pretty(&origin).unwrap_or_default();
    crate::hub::cache::write_atomic(&DataOrigin::sidecar(&out), json.as_bytes())?;
    Ok(out)
}

/// The rows of the split's files, in order.
fn rows(d: &NamedDataset, files: &[PathBuf]) -> Result<Vec<String>, DataError> {
    let mut out = Vec::new();
    for f in files {
        match d.format {
            FileFormat::Parquet => out.extend(super::source::parquet_rows(f, d.field)?),
            FileFormat::JsonGz => out.extend(json_gz_rows(f, d.field)?),
        }
    }
    Ok(out)
}

fn json_gz_rows(path: &Path, field: &str) -> Result<Vec<String>, DataError> {
    use std::io::Read;
    let read = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(f)
        .read_to_string(&mut text)
        .map_err(read)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| DataError::Record {
            path: path.to_path_buf(),
            line: i + 1,
            detail: format!("not a JSON record: {e}"),
        })?;
        let s = v[field].as_str().ok_or_else(|| DataError::Record {
            path: path.to_path_buf(),
            line: i + 1,
            detail: format!("no string field '{field}'"),
        })?;
        out.push(s.to_string());
    }
    Ok(out)
}

/// The text a join makes of the rows.
fn joined_text(d: &NamedDataset, files: &[PathBuf], join: Join) -> Result<String, DataError> {
    let rows = rows(d, files)?;
    Ok(match join {
        Join::Concat => rows.concat(),
        Join::Lines => rows.iter().map(|r| format!("{r}\n")).collect(),
        Join::BlankLine => rows.join("\n\n"),
        Join::Documents => rows
            .iter()
            .map(|r| format!("{}\n", serde_json::json!({ d.field: r })))
            .collect(),
        Join::C4Gptq => rows
            .iter()
            .take(1100)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_splits_resolve_or_say_what_exists() {
        assert!(is_dataset_name("wikitext-2"));
        assert!(is_dataset_name("WikiText-2:validation"));
        assert!(!is_dataset_name("wiki.test.raw"));
        let dir = tempfile::tempdir().unwrap();
        // An existing path is a path, whatever its name.
        let p = dir.path().join("ptb");
        std::fs::write(&p, "text").unwrap();
        assert_eq!(local_data(&p, None).unwrap().path, p);
        let e = local_data(Path::new("wikitext-2:dev"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no split 'dev'") && e.contains("test, validation, train"),
            "{e}"
        );
        let e = local_data(Path::new("wikitext2"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a dataset name") && e.contains("wikitext-103"),
            "{e}"
        );
        // A path that does not exist is left to the reader's error.
        let missing = local_data(Path::new("no/such.txt"), None).unwrap();
        assert_eq!(missing.path, Path::new("no/such.txt"));
    }
}
