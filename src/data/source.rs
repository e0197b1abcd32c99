//! Where the evaluation text comes from (`--data`): a UTF-8 text file, `-` for standard input,
//! a JSON Lines file (`.jsonl`/`.ndjson`: one document per record, its `--text-field`), a
//! Parquet file as Hugging Face datasets store them (`.parquet`: one document per row, its
//! `--text-field` string column, read one row group at a time), or a directory: of Parquet
//! shards (`test-00000-of-00002.parquet`, …) when it holds only those, else of text files
//! (one document each); either way in file-name order.
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
        return load_dir(path, text_field);
    }
    if is_jsonl(path) {
        return load_jsonl(path, text_field);
    }
    if is_parquet(path) {
        let mut docs = Vec::new();
        parquet_documents(path, text_field, &mut docs, false)?;
        return Data::from_documents(path, docs);
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

/// Is `path` a Parquet file (by its extension)?
pub fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Every row's string of column `field`, blank ones included (a dataset's rows as they are
/// stored, for joins that depend on them); null rows are skipped.
pub fn parquet_rows(path: &Path, field: &str) -> Result<Vec<String>, DataError> {
    let mut rows = Vec::new();
    parquet_documents(path, field, &mut rows, true)?;
    Ok(rows)
}

/// Appends the strings of column `field` of a Parquet file to `docs`, row group by row group
/// (only that column is decoded); blank ones only with `keep_blank`. Null rows are skipped,
/// as blank records are.
fn parquet_documents(
    path: &Path,
    field: &str,
    docs: &mut Vec<String>,
    keep_blank: bool,
) -> Result<(), DataError> {
    use parquet::basic::{ConvertedType, LogicalType, Type as Physical};
    use parquet::column::reader::{get_typed_column_reader, ColumnReader};
    use parquet::data_type::ByteArrayType;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let bad = |detail: String| DataError::Parquet {
        path: path.to_path_buf(),
        detail,
    };
    let file = std::fs::File::open(path).map_err(|source| DataError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| bad(format!("not a readable Parquet file ({e})")))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
    let column = names.iter().position(|n| n == field).ok_or_else(|| {
        bad(format!(
            "no column '{field}' (the file has: {}); name the text column with --text-field",
            names.join(", ")
        ))
    })?;
    let descr = schema.column(column);
    let is_string = descr.physical_type() == Physical::BYTE_ARRAY
        && (matches!(descr.logical_type_ref(), Some(LogicalType::String))
            || descr.converted_type() == ConvertedType::UTF8);
    if !is_string || descr.max_rep_level() > 0 {
        return Err(bad(format!(
            "column '{field}' is not a string column ({:?}{}); --text-field must name one",
            descr.physical_type(),
            if descr.max_rep_level() > 0 {
                ", repeated"
            } else {
                ""
            }
        )));
    }
    let max_def = descr.max_def_level();
    for g in 0..reader.num_row_groups() {
        let group = reader
            .get_row_group(g)
            .map_err(|e| bad(format!("row group {g}: {e}")))?;
        let rows = group.metadata().num_rows() as usize;
        let col = group
            .get_column_reader(column)
            .map_err(|e| bad(format!("row group {g}: {e}")))?;
        let ColumnReader::ByteArrayColumnReader(_) = &col else {
            return Err(bad(format!("column '{field}' is not a byte-array column")));
        };
        let mut typed = get_typed_column_reader::<ByteArrayType>(col);
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        let mut read = 0;
        while read < rows {
            let (records, _, _) = typed
                .read_records(rows - read, Some(&mut defs), None, &mut values)
                .map_err(|e| bad(format!("row group {g}: {e}")))?;
            if records == 0 {
                return Err(bad(format!(
                    "row group {g} ends after {read} of its {rows} rows (a truncated file?)"
                )));
            }
            read += records;
        }
        // Without nulls every row has a value; with them, defs says which rows do.
        let present = if max_def == 0 {
            rows
        } else {
            defs.iter().filter(|&&d| d == max_def).count()
        };
        if present != values.len() {
            return Err(bad(format!(
                "row group {g}: {} values for {present} non-null rows",
                values.len()
            )));
        }
        for (i, v) in values.iter().enumerate() {
            let s = std::str::from_utf8(v.data()).map_err(|e| {
                bad(format!(
                    "row group {g}, value {i} of column '{field}' is not valid UTF-8 (byte {})",
                    e.valid_up_to()
                ))
            })?;
            if keep_blank || !s.trim().is_empty() {
                docs.push(s.to_string());
            }
        }
    }
    Ok(())
}

fn load_dir(dir: &Path, text_field: &str) -> Result<Data, DataError> {
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
    if !files.is_empty() && files.iter().all(|f| is_parquet(f)) {
        for f in &files {
            parquet_documents(f, text_field, &mut docs, false)?;
        }
        return Data::from_documents(dir, docs);
    }
    for f in &files {
        match read_text(f) {
            Ok(t) => docs.push(t),
            // An empty file is an empty document: nothing to score, not an error.
            Err(DataError::Empty { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if docs.is_empty() {
        return Err(DataError::EmptyDir {
            path: dir.to_path_buf(),
            files: files.len(),
        });
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
