//! Where the evaluation text comes from (`--data`): a UTF-8 text file, `-` for standard input,
//! a JSON Lines file (`.jsonl`/`.ndjson`: one document per record, its `--text-field`), or a
//! directory of text files (one document each, in file-name order).
//!
//! Record-based sources know their documents: the `rolling` method scores each one on its
//! own, and `chunks`/`stride` see the documents joined by a blank line ([`SEPARATOR`]).
//! Nothing is altered: a record's text is used byte for byte, and invalid UTF-8 or a
//! malformed record is an error naming the file (and line) and the fix.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{documents, read_text, DataError, Document};

/// Between documents when record-based sources are joined into one text.
pub const SEPARATOR: &str = "\n\n";

/// The data of a run: its text and, for record-based sources, each document's byte range.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    pub text: String,
    pub doc_ranges: Option<Vec<Range<usize>>>,
}

impl Data {
    /// The documents: the records, or the text split as [`documents`] does.
    pub fn documents(&self) -> Vec<Document<'_>> {
        match &self.doc_ranges {
            Some(ranges) => ranges
                .iter()
                .map(|r| Document::new(&self.text[r.clone()]))
                .collect(),
            None => documents(&self.text),
        }
    }

    fn from_documents(path: &Path, docs: Vec<String>) -> Result<Self, DataError> {
        if docs.is_empty() {
            return Err(DataError::Empty {
                path: path.to_path_buf(),
            });
        }
        let mut text = String::with_capacity(docs.iter().map(|d| d.len() + 2).sum());
        let mut ranges = Vec::with_capacity(docs.len());
        for d in docs {
            if !text.is_empty() {
                text.push_str(SEPARATOR);
            }
            let start = text.len();
            text.push_str(&d);
            ranges.push(start..text.len());
        }
        Ok(Self {
            text,
            doc_ranges: Some(ranges),
        })
    }
}

/// Is `path` a JSON Lines file (by its extension)?
pub fn is_jsonl(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"))
}

/// Reads `--data`: a text file, a JSON Lines file (documents from `text_field`) or a
/// directory. (`-` is read by the command line into a file first, so that every rank and a
/// resumed run read the same bytes.)
pub fn load(path: &Path, text_field: &str) -> Result<Data, DataError> {
    if path.is_dir() {
        return load_dir(path);
    }
    if is_jsonl(path) {
        return load_jsonl(path, text_field);
    }
    Ok(Data {
        text: read_text(path)?,
        doc_ranges: None,
    })
}

fn load_jsonl(path: &Path, field: &str) -> Result<Data, DataError> {
    let text = read_text(path)?;
    let bad = |line: usize, detail: String| DataError::Record {
        path: path.to_path_buf(),
        line,
        detail,
    };
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| bad(i + 1, format!("not a JSON record: {e}")))?;
        match record.get(field) {
            Some(serde_json::Value::String(s)) => {
                if !s.trim().is_empty() {
                    docs.push(s.clone());
                }
            }
            Some(other) => {
                return Err(bad(
                    i + 1,
                    format!("field '{field}' is not a string but {other}"),
                ))
            }
            None => {
                let keys: Vec<String> = record
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default();
                return Err(bad(
                    i + 1,
                    format!(
                        "no field '{field}' (the record has: {}); name the text field with --text-field",
                        if keys.is_empty() { "no fields".to_string() } else { keys.join(", ") }
                    ),
                ));
            }
        }
    }
    Data::from_documents(path, docs)
}

fn load_dir(dir: &Path) -> Result<Data, DataError> {
    let read_err = |source| DataError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    let mut docs = Vec::with_capacity(files.len());
    for f in &files {
        match read_text(f) {
            Ok(t) => docs.push(t),
            // An empty file is an empty document: nothing to score, not an error.
            Err(DataError::Empty { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Data::from_documents(dir, docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_records_become_documents_joined_by_a_blank_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        std::fs::write(
            &p,
            "{\"text\": \"One doc.\\n\", \"id\": 1}\n\n{\"text\": \"Two  docs\"}\n{\"text\": \"  \"}\n",
        )
        .unwrap();
        let d = load(&p, "text").unwrap();
        assert_eq!(d.text, "One doc.\n\n\nTwo  docs");
        let docs = d.documents();
        assert_eq!(
            docs.iter().map(|d| d.text).collect::<Vec<_>>(),
            ["One doc.\n", "Two  docs"]
        );
        assert_eq!(docs[1].words, 2);
        let e = load(&p, "content").unwrap_err().to_string();
        assert!(
            e.contains("d.jsonl") && e.contains("line 1") && e.contains("id, text"),
            "{e}"
        );
        std::fs::write(&p, "{\"text\": 3}\n").unwrap();
        assert!(load(&p, "text")
            .unwrap_err()
            .to_string()
            .contains("not a string"));
        std::fs::write(&p, "{\"text\": \"ok\"}\nnot json\n").unwrap();
        assert!(load(&p, "text").unwrap_err().to_string().contains("line 2"));
        std::fs::write(&p, "\n{\"text\": \"\"}\n").unwrap();
        assert!(matches!(load(&p, "text"), Err(DataError::Empty { .. })));
    }

    #[test]
    fn a_directory_is_one_document_per_file_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "second").unwrap();
        std::fs::write(dir.path().join("a.txt"), "first\n").unwrap();
        std::fs::write(dir.path().join("c.txt"), "").unwrap();
        std::fs::write(dir.path().join(".hidden"), "skipped").unwrap();
        let d = load(dir.path(), "text").unwrap();
        assert_eq!(d.text, "first\n\n\nsecond");
        assert_eq!(d.documents().len(), 2);
        std::fs::write(dir.path().join("d.bin"), [0u8, 1, 2]).unwrap();
        assert!(matches!(
            load(dir.path(), "text"),
            Err(DataError::Binary { .. })
        ));
    }
}
