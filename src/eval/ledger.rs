//! The run ledger: every finished window's exact record, appended to a per-rank file in the run
//! directory as soon as it exists, so that a crashed run can be resumed (`ppl eval --resume`)
//! without recomputing what was done, and the resumed result is bit-identical to an
//! uninterrupted run.
//!
//! File layout (`ledger-a{attempt}-r{rank}.bin`, little endian):
//!
//! ```text
//! "PPLLEDG1" | u32 header length | u32 CRC-32 of header | header (JSON: version, rank, attempt,
//!                                                                  binding)
//! then per record:  u32 payload length | u32 CRC-32 of payload | payload (JSON WindowResult)
//! ```
//!
//! A record is written with one `write` call and the file is fsynced at a bounded interval
//! (`PPL_LEDGER_FSYNC_S`, default 2 s) and at the end. A crash at any byte leaves a readable
//! prefix: the reader stops at the first record whose length runs past the end of the file or
//! whose checksum fails, and reports how many bytes it dropped. The header's [`Binding`] ties the
//! file to the model, data, tokenizer and value-affecting options; a resume with anything else
//! is refused with what differs. Each attempt writes new files, so a torn tail is never
//! appended to.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Record, WindowResult};

const MAGIC: &[u8; 8] = b"PPLLEDG1";
const VERSION: u32 = 1;
/// Largest record or header accepted. An eval window's record is a few hundred bytes; a
/// comparison's carries about 90 bytes per scored token (a 64k-token window: under 6 MiB).
/// Records are read from memory and checked against the file's length, so the bound only
/// stops a damaged length from being believed.
const MAX_CHUNK: usize = 64 << 20;

/// What a ledger's records are valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub model_sha256: String,
    pub data_sha256: String,
    pub tokenizer_sha256: String,
    /// The options that change a window's value (method, ctx, stride, chunks, precision,
    /// tensor-parallel degree, lossy activation compression), as JSON.
    pub config: String,
    /// Windows in the run.
    pub windows: usize,
    /// What `ppl compare` compares with (the base's fingerprint and precision); absent for
    /// `ppl eval`, whose ledgers written before comparisons kept ledgers still resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl Binding {
    /// Human-readable differences (`what: ledger value vs this run's`).
    pub fn differences(&self, now: &Binding) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |what: &str, a: &str, b: &str| {
            if a != b {
                out.push(format!("{what}: ledger {a}, this run {b}"));
            }
        };
        cmp("model sha256", &self.model_sha256, &now.model_sha256);
        cmp("data sha256", &self.data_sha256, &now.data_sha256);
        cmp(
            "tokenizer sha256",
            &self.tokenizer_sha256,
            &now.tokenizer_sha256,
        );
        cmp("scoring options", &self.config, &now.config);
        let base = |b: &Option<String>| b.clone().unwrap_or_else(|| "none (ppl eval)".into());
        cmp("base", &base(&self.base), &base(&now.base));
        cmp(
            "windows",
            &self.windows.to_string(),
            &now.windows.to_string(),
        );
        out
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    pub rank: usize,
    pub attempt: usize,
    pub binding: Binding,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{path}: {source}; check that the run directory is writable (--run-dir)")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a ppl ledger ({detail}); --resume takes a run directory written by `ppl eval` or `ppl compare`")]
    NotALedger { path: PathBuf, detail: String },
    #[error("{path} belongs to a different evaluation: {}; resume with what the run was started with (its model, base, data and scoring options; `--resume DIR` alone reuses them), or start a new run directory", differences.join("; "))]
    Foreign {
        path: PathBuf,
        differences: Vec<String>,
    },
    #[error("{dir} holds no ledger (ledger-*.bin); nothing to resume — run without --resume, or check the path")]
    Empty { dir: PathBuf },
    #[error("{dir}: the ledger's record of window {index} is impossible ({detail}) although its checksum is valid; the run directory was altered — delete it and run again without --resume")]
    Implausible {
        dir: PathBuf,
        index: usize,
        detail: String,
    },
    #[error("window {index} is recorded twice with different values ({a} and {b}); the run directory mixes two evaluations")]
    Conflict {
        index: usize,
        a: PathBuf,
        b: PathBuf,
    },
}

type Result<T> = std::result::Result<T, LedgerError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LedgerError + '_ {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn chunk(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Appends records to this rank's ledger file.
pub struct LedgerWriter {
    file: File,
    path: PathBuf,
    last_sync: Instant,
    interval: Duration,
    pub records: u64,
}

impl LedgerWriter {
    /// Creates `dir/ledger-a{attempt}-r{rank}.bin` with its header.
    pub fn create(dir: &Path, rank: usize, attempt: usize, binding: Binding) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(format!("ledger-a{attempt}-r{rank}.bin"));
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        let header = Header {
            version: VERSION,
            rank,
            attempt,
            binding,
        };
        let mut bytes = MAGIC.to_vec();
        bytes.extend(chunk(
            &serde_json::to_vec(&header).expect("headers serialize"),
        ));
        file.write_all(&bytes).map_err(io(&path))?;
        file.sync_all().map_err(io(&path))?;
        let interval = std::env::var("PPL_LEDGER_FSYNC_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(Duration::from_secs(2), Duration::from_secs_f64);
        Ok(Self {
            file,
            path,
            last_sync: Instant::now(),
            interval,
            records: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends each record (one `write` each, in its ledger form), fsyncing when the interval
    /// has passed.
    pub fn append<R: Record>(&mut self, records: &[R]) -> Result<()> {
        for r in records {
            let bytes = chunk(&r.ledger_json());
            self.file.write_all(&bytes).map_err(io(&self.path))?;
            self.records += 1;
        }
        if self.last_sync.elapsed() >= self.interval {
            self.sync()?;
        }
        Ok(())
    }

    pub fn sync(&mut self) -> Result<()> {
        self.file.sync_data().map_err(io(&self.path))?;
        self.last_sync = Instant::now();
        Ok(())
    }
}

/// What a ledger file holds: its header, every intact record, and how much of a torn or
/// corrupt tail was dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Contents<R = WindowResult> {
    pub header: Header,
    pub records: Vec<R>,
    pub dropped_bytes: u64,
}

/// Parses a ledger image of `ppl eval` (never panics, whatever the bytes).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Contents> {
    parse_records(path, bytes)
}

/// Parses a ledger image whose records are `R` (never panics, whatever the bytes).
pub fn parse_records<R: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<Contents<R>> {
    let not = |detail: &str| LedgerError::NotALedger {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(not("no PPLLEDG1 signature"));
    }
    let mut pos = MAGIC.len();
    let header_bytes =
        next_chunk(bytes, &mut pos, MAX_CHUNK).ok_or_else(|| not("truncated header"))?;
    let header: Header =
        serde_json::from_slice(header_bytes).map_err(|_| not("unreadable header"))?;
    if header.version != VERSION {
        return Err(not(&format!(
            "version {}, expected {VERSION}",
            header.version
        )));
    }
    let mut records = Vec::new();
    loop {
        let start = pos;
        match next_chunk(bytes, &mut pos, MAX_CHUNK) {
            Some(payload) => match serde_json::from_slice::<R>(payload) {
                Ok(r) => records.push(r),
                Err(_) => {
                    pos = start;
                    break;
                }
            },
            None => {
                pos = start;
                break;
            }
        }
    }
    Ok(Contents {
        header,
        records,
        dropped_bytes: (bytes.len() - pos) as u64,
    })
}

/// The next length-prefixed, checksummed chunk (at most `max` bytes) at `pos`, advancing it;
/// `None` when torn or corrupt.
pub(crate) fn next_chunk<'a>(bytes: &'a [u8], pos: &mut usize, max: usize) -> Option<&'a [u8]> {
    let head = bytes.get(*pos..pos.checked_add(8)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    if len > max {
        return None;
    }
    let start = *pos + 8;
    let payload = bytes.get(start..start.checked_add(len)?)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    *pos = start + len;
    Some(payload)
}

/// The largest NLL of one token a record may claim, in nats: far beyond any real model's
/// (e^1e6 is no finite PPL), small enough that sums of squares fit the fixed-point integers.
pub const MAX_TOKEN_NLL: f64 = 1e6;

/// Checks that a record read back from a ledger could have been written by a run of this plan
/// ([`Record::implausibility`], with `expected` scored tokens): the CRC only proves the bytes
/// were not torn, not that they are true.
pub fn check_record<R: Record>(dir: &Path, r: &R, expected: usize) -> Result<()> {
    match r.implausibility(expected) {
        None => Ok(()),
        Some(detail) => Err(LedgerError::Implausible {
            dir: dir.to_path_buf(),
            index: r.index(),
            detail,
        }),
    }
}

/// Ledger files of a run directory, in name order.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ledger-") && n.ends_with(".bin"))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The attempt number for a new run in `dir` (one more than any ledger there).
pub fn next_attempt(dir: &Path) -> usize {
    files(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            let n = p.file_name()?.to_str()?;
            n.strip_prefix("ledger-a")?
                .split('-')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |a| a + 1)
}

/// Everything a run directory's ledgers recorded for `binding`, one record per window (sorted
/// by index), with a note per file that lost a torn tail. A foreign ledger is an error.
pub fn load<R: Record>(dir: &Path, binding: &Binding) -> Result<(Vec<R>, Vec<String>)> {
    let paths = files(dir)?;
    if paths.is_empty() {
        return Err(LedgerError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    let mut by_index: std::collections::BTreeMap<usize, (R, PathBuf)> = Default::default();
    let mut notes = Vec::new();
    for path in paths {
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let c = parse_records::<R>(&path, &bytes)?;
        let differences = c.header.binding.differences(binding);
        if !differences.is_empty() {
            return Err(LedgerError::Foreign { path, differences });
        }
        if c.dropped_bytes > 0 {
            notes.push(format!(
                "{}: dropped a torn or corrupt tail of {} bytes after {} intact records",
                path.display(),
                c.dropped_bytes,
                c.records.len()
            ));
        }
        for r in c.records {
            let index = r.index();
            if index >= binding.windows {
                return Err(LedgerError::NotALedger {
                    path,
                    detail: format!("window {index} of a run of {}", binding.windows),
                });
            }
            match by_index.get(&index) {
                Some((old, old_path)) if !old.same_values(&r) => {
                    return Err(LedgerError::Conflict {
                        index,
                        a: old_path.clone(),
                        b: path,
                    })
                }
                Some(_) => {}
                None => {
                    by_index.insert(index, (r, path.clone()));
                }
            }
        }
    }
    Ok((by_index.into_values().map(|(r, _)| r).collect(), notes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::NllAccumulator;

    fn binding() -> Binding {
        Binding {
            model_sha256: "m".into(),
            data_sha256: "d".into(),
            tokenizer_sha256: "t".into(),
            config: "{}".into(),
            windows: 10,
            base: None,
        }
    }

    fn record(i: usize) -> WindowResult {
        let mut acc = NllAccumulator::default();
        acc.add(i as f64 * 0.37 + 1.0);
        acc.add(2.5);
        WindowResult {
            index: i,
            group: i,
            input_tokens: 16,
            acc,
            rank: 1,
            finished_s: i as f64,
        }
    }

    #[test]
    fn a_cut_at_any_byte_leaves_a_readable_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LedgerWriter::create(dir.path(), 1, 0, binding()).unwrap();
        let records: Vec<WindowResult> = (0..5).map(record).collect();
        w.append(&records).unwrap();
        w.sync().unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let full = parse(w.path(), &bytes).unwrap();
        assert_eq!(full.records, records);
        assert_eq!(full.dropped_bytes, 0);
        let header_end = bytes.len()
            - records
                .iter()
                .map(|r| 8 + serde_json::to_vec(r).unwrap().len())
                .sum::<usize>();
        let mut seen = 0;
        for cut in 0..bytes.len() {
            match parse(w.path(), &bytes[..cut]) {
                Ok(c) => {
                    assert!(cut >= header_end);
                    // Records only ever appear in order, and whole.
                    assert!(c.records.len() >= seen);
                    seen = c.records.len();
                    assert_eq!(c.records[..], records[..c.records.len()]);
                    assert!(c.dropped_bytes < bytes.len() as u64);
                }
                Err(LedgerError::NotALedger { .. }) => assert!(cut < header_end),
                Err(e) => panic!("cut {cut}: {e}"),
            }
        }
        // A flipped byte inside the third record drops it and everything after it.
        let mut bad = bytes.clone();
        let third = header_end
            + records[..2]
                .iter()
                .map(|r| 8 + serde_json::to_vec(r).unwrap().len())
                .sum::<usize>();
        bad[third + 12] ^= 0x40;
        let c = parse(w.path(), &bad).unwrap();
        assert_eq!(c.records.len(), 2);
        assert!(c.dropped_bytes > 0);
    }

    #[test]
    fn foreign_and_conflicting_ledgers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LedgerWriter::create(dir.path(), 0, 0, binding()).unwrap();
        w.append(&[record(1), record(3)]).unwrap();
        let (got, notes) = load::<WindowResult>(dir.path(), &binding()).unwrap();
        assert_eq!(got.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 3]);
        assert!(notes.is_empty());
        assert_eq!(next_attempt(dir.path()), 1);

        let other = Binding {
            data_sha256: "other".into(),
            ..binding()
        };
        match load::<WindowResult>(dir.path(), &other) {
            Err(LedgerError::Foreign { differences, .. }) => {
                assert_eq!(differences, vec!["data sha256: ledger d, this run other"])
            }
            r => panic!("{r:?}"),
        }

        let mut w2 = LedgerWriter::create(dir.path(), 1, 1, binding()).unwrap();
        let mut changed = record(3);
        changed.acc.add(1.0);
        w2.append(&[changed]).unwrap();
        assert!(matches!(
            load::<WindowResult>(dir.path(), &binding()),
            Err(LedgerError::Conflict { index: 3, .. })
        ));

        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            load::<WindowResult>(empty.path(), &binding()),
            Err(LedgerError::Empty { .. })
        ));
        assert!(matches!(
            parse(Path::new("x"), b"not a ledger at all"),
            Err(LedgerError::NotALedger { .. })
        ));
    }
}
