//! Data: reading the evaluation text ([`read_text`], and the record-based sources of
//! [`source`]), splitting it into documents ([`documents`]) and cutting token streams into
//! scored windows ([`windows`]); the word count of word perplexity ([`words`]).

pub mod named;
pub mod source;
pub mod windows;
pub mod words;

use std::path::{Path, PathBuf};

pub use source::{load, Data};
pub use windows::{Method, Window, WindowPlan};
pub use words::count_words;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read data file {path}: {source} (check the path given to --data)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data file {path} is not valid UTF-8 (first bad byte at offset {offset}); convert it, e.g. `iconv -f latin1 -t utf-8`")]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("data file {path} is empty (or only whitespace); there is nothing to evaluate")]
    Empty { path: PathBuf },
    #[error("data directory {path} holds no text to evaluate ({files} visible file(s), all empty); put UTF-8 text, .jsonl or .parquet files in it, or give a file with --data")]
    EmptyDir { path: PathBuf, files: usize },
    #[error("--data {path} is {kind}, not a text file; give a file, a directory, or - for standard input")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("data file {path} looks binary (a NUL byte at offset {offset}); --data takes a UTF-8 text file")]
    Binary { path: PathBuf, offset: usize },
    #[error("{path}, line {line}: {detail}")]
    Record {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error("{path}: {detail}")]
    Parquet { path: PathBuf, detail: String },
    #[error("{0}")]
    Windows(String),
}

/// Reads a UTF-8 text file. Invalid UTF-8 is an error (never silently replaced), so that the
/// scored tokens are exactly the file's text; so is a NUL byte (a binary file).
pub fn read_text(path: &Path) -> Result<String, DataError> {
    // A device reads without end (/dev/zero, /dev/urandom); a FIFO is a stream that ends
    // (`--data <(zcat text.gz)`) and stays allowed.
    if let Some(kind) =
        crate::preflight::special_file_kind(path).filter(|k| !k.starts_with("a FIFO"))
    {
        return Err(DataError::NotAFile {
            path: path.to_path_buf(),
            kind,
        });
    }
    let bytes = std::fs::read(path).map_err(|source| DataError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // NUL never occurs in text: a binary file is named as such, not as bad UTF-8.
    if let Some(offset) = bytes.iter().position(|&b| b == 0) {
        return Err(DataError::Binary {
            path: path.to_path_buf(),
            offset,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    if text.trim().is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

/// A document of the text: a byte range of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Document<'a> {
    pub text: &'a str,
    /// lm-eval's word count: `len(re.split(r"\s+", text))`.
    pub words: u64,
    pub bytes: u64,
}

impl<'a> Document<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            words: count_words(text),
            bytes: text.len() as u64,
        }
    }
}

/// Whether a line is a top-level wikitext heading such as ` = Robert Boulter = `.
fn is_wikitext_title(line: &str) -> bool {
    let t = line.trim();
    t.len() > 4
        && t.starts_with("= ")
        && t.ends_with(" =")
        && !t.starts_with("= =")
        && !t.ends_with("= =")
}

/// Splits a text into documents: wikitext articles (each starting at a top-level
/// `= Title =` line) when the text has such headings, else blank-line separated paragraphs.
/// Whitespace-only pieces are dropped.
pub fn documents(text: &str) -> Vec<Document<'_>> {
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if is_wikitext_title(line) {
            starts.push(offset);
        }
        offset += line.len();
    }
    let mut docs = Vec::new();
    if !starts.is_empty() {
        if starts[0] != 0 {
            starts.insert(0, 0);
        }
        starts.push(text.len());
        for w in starts.windows(2) {
            let piece = &text[w[0]..w[1]];
            if !piece.trim().is_empty() {
                docs.push(Document::new(piece));
            }
        }
        return docs;
    }
    // Paragraphs: split at runs of lines that are empty or whitespace-only.
    let mut start: Option<usize> = None;
    let mut end = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim().is_empty() {
            if let Some(s) = start.take() {
                docs.push(Document::new(&text[s..end]));
            }
        } else {
            start.get_or_insert(offset);
            end = offset + line.trim_end_matches(['\n', '\r']).len();
        }
        offset += line.len();
    }
    if let Some(s) = start {
        docs.push(Document::new(&text[s..end]));
    }
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_count_like_python_re_split() {
        assert_eq!(count_words("a b  c"), 3);
        assert_eq!(count_words(" = Title = \n"), 5);
        assert_eq!(count_words(""), 1);
    }

    #[test]
    fn wikitext_articles_and_paragraphs() {
        let t = " \n = A = \n \n x y \n = = Sub = = \n z \n = B = \n w \n";
        let d = documents(t);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].text, " = A = \n \n x y \n = = Sub = = \n z \n");
        assert_eq!(d[1].text, " = B = \n w \n");
        let p = documents("one\ntwo\n\n  \nthree\n");
        let texts: Vec<_> = p.iter().map(|d| d.text).collect();
        assert_eq!(texts, vec!["one\ntwo", "three"]);
    }
}
