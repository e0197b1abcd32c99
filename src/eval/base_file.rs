//! The base file of `ppl compare --save-base FILE` / `--base-logits FILE`: what a later
//! comparison needs of the base model, so that only the compared model and the base's output
//! layer are in memory then.
//!
//! The file stores, per scored token, the base's final hidden state (after its final norm)
//! in f32: the exact input of the base's output layer. The reading run loads only that layer
//! (final norm and output weights, from the base GGUF the header names and fingerprints) and
//! recomputes the base's logits from the stored rows with the same code, on the same rows:
//! the base's distribution is reproduced bit for bit, so the error bound is zero (tested:
//! a comparison from the file equals the one with both models in memory to the last bit).
//!
//! Size: `hidden × 4` bytes per scored token (SmolLM2: 2,304 bytes; llama.cpp's file holds the
//! whole vocabulary in 16 bits, 98,304 bytes per token for SmolLM2, 43× more).
//!
//! Layout (little endian): the magic `PPLBASE\x02`, then length-prefixed CRC-32 chunks (as the
//! ledger's): first a JSON [`BaseFileHeader`] binding the file to the base model, the data,
//! the tokenizer and the window plan, then one chunk per window in window order (`u64` index,
//! `u32` token count, `count × hidden` f32). A file that is cut short, corrupt, or made for
//! other data or another plan is refused with what differs.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ledger::{chunk, next_chunk, Binding};
use crate::model::Precision;

const MAGIC: &[u8; 8] = b"PPLBASE\x02";
pub const VERSION: u32 = 2;
/// A window's chunk: its tokens' hidden states.
const MAX_WINDOW_BYTES: usize = 1 << 31;

/// What a base file holds and what it is valid for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseFileHeader {
    pub version: u32,
    /// The base model as given when the file was saved (its output layer is loaded from it).
    pub base_path: String,
    pub base_precision: Precision,
    /// `model_sha256` is the base model's; `config` the window plan's options.
    pub binding: Binding,
    /// Width of a stored row (the base's hidden size).
    pub hidden: usize,
    pub tokens: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum BaseFileError {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a usable base file ({detail}); re-create it with `ppl compare --base BASE.gguf --save-base {path}` and the same evaluation options")]
    Invalid { path: PathBuf, detail: String },
}

/// Writes the file atomically (a temporary file renamed into place); `windows[i]` holds window
/// `i`'s rows, `hidden` values each.
pub fn write(
    path: &Path,
    header: &BaseFileHeader,
    windows: &[Vec<f32>],
) -> Result<(), BaseFileError> {
    let io = |what, source| BaseFileError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
    let mut f = std::io::BufWriter::new(file);
    let header_json = serde_json::to_vec(header).expect("headers serialize");
    f.write_all(MAGIC)
        .and_then(|_| f.write_all(&chunk(&header_json)))
        .map_err(|e| io("write", e))?;
    let mut payload = Vec::new();
    for (index, rows) in windows.iter().enumerate() {
        payload.clear();
        payload.extend_from_slice(&(index as u64).to_le_bytes());
        payload.extend_from_slice(&((rows.len() / header.hidden.max(1)) as u32).to_le_bytes());
        payload.extend(rows.iter().flat_map(|v| v.to_le_bytes()));
        f.write_all(&chunk(&payload)).map_err(|e| io("write", e))?;
    }
    let file = f.into_inner().map_err(|e| io("write", e.into_error()))?;
    file.sync_all().map_err(|e| io("write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("rename into place", e))
}

/// Reads a whole base file: its header and every window's rows, in window order.
pub fn read(path: &Path) -> Result<(BaseFileHeader, Vec<Vec<f32>>), BaseFileError> {
    let bytes = std::fs::read(path).map_err(|source| BaseFileError::Io {
        what: "read the base file (--base-logits)",
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |detail: String| BaseFileError::Invalid {
        path: path.to_path_buf(),
        detail,
    };
    if bytes.get(..MAGIC.len()) != Some(MAGIC.as_slice()) {
        return Err(invalid(
            "it does not start with ppl's base-file magic".into(),
        ));
    }
    let mut pos = MAGIC.len();
    let header: BaseFileHeader = next_chunk(&bytes, &mut pos, 1 << 20)
        .and_then(|h| serde_json::from_slice(h).ok())
        .ok_or_else(|| invalid("its header is truncated or corrupt".into()))?;
    if header.version != VERSION || header.hidden == 0 {
        return Err(invalid(format!(
            "format version {} with rows of {} values; this ppl reads version {VERSION}",
            header.version, header.hidden
        )));
    }
    let mut windows: Vec<Vec<f32>> = Vec::with_capacity(header.binding.windows.min(1 << 20));
    while pos < bytes.len() {
        let at = windows.len();
        let payload = next_chunk(&bytes, &mut pos, MAX_WINDOW_BYTES).ok_or_else(|| {
            invalid(format!(
                "window {at} is cut short or corrupt ({at} of {} windows readable)",
                header.binding.windows
            ))
        })?;
        let (head, rows) = payload.split_at(payload.len().min(12));
        let index = head
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let count = head
            .get(8..12)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
        if index != Some(at as u64) {
            return Err(invalid(format!("window {at} is missing or out of order")));
        }
        if count.map(|c| c * header.hidden * 4) != Some(rows.len()) {
            return Err(invalid(format!(
                "window {at} holds {} bytes, not {:?} rows of {} f32",
                rows.len(),
                count,
                header.hidden
            )));
        }
        windows.push(
            rows.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect(),
        );
    }
    if windows.len() != header.binding.windows {
        return Err(invalid(format!(
            "{} of {} windows present: the file is incomplete",
            windows.len(),
            header.binding.windows
        )));
    }
    let tokens: usize = windows.iter().map(|w| w.len() / header.hidden).sum();
    if tokens != header.tokens {
        return Err(invalid(format!(
            "{tokens} tokens, the header says {}",
            header.tokens
        )));
    }
    Ok((header, windows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (BaseFileHeader, Vec<Vec<f32>>) {
        let windows = vec![
            crate::test_util::uniform(1, 4 * 8, 3.0),
            crate::test_util::uniform(2, 2 * 8, 3.0),
        ];
        let header = BaseFileHeader {
            version: VERSION,
            base_path: "base.gguf".into(),
            base_precision: Precision::F32,
            binding: Binding {
                model_sha256: "m".into(),
                data_sha256: "d".into(),
                tokenizer_sha256: "t".into(),
                config: "{}".into(),
                windows: 2,
                base: None,
            },
            hidden: 8,
            tokens: 6,
        };
        (header, windows)
    }

    #[test]
    fn round_trip_is_exact_and_every_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.pplbase");
        let (header, windows) = sample();
        write(&path, &header, &windows).unwrap();
        let (h, w) = read(&path).unwrap();
        assert_eq!(h, header);
        // Bit for bit.
        let bits =
            |w: &[Vec<f32>]| -> Vec<u32> { w.iter().flatten().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&w), bits(&windows));

        let bytes = std::fs::read(&path).unwrap();
        let damaged = dir.path().join("damaged");
        // Every cut refuses the file (incomplete), never a partial read.
        for cut in 0..bytes.len() {
            std::fs::write(&damaged, &bytes[..cut]).unwrap();
            assert!(read(&damaged).is_err(), "cut at {cut} accepted");
        }
        // A flipped byte in the last window fails its checksum.
        let mut flipped = bytes.clone();
        let at = flipped.len() - 5;
        flipped[at] ^= 0x40;
        std::fs::write(&damaged, &flipped).unwrap();
        let e = read(&damaged).unwrap_err().to_string();
        assert!(e.contains("window 1") && e.contains("--save-base"), "{e}");
        std::fs::write(&damaged, b"GGUF....").unwrap();
        assert!(read(&damaged).unwrap_err().to_string().contains("magic"));
    }
}
