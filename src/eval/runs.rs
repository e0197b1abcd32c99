//! Run directories: where `ppl eval` keeps a run's ledger of finished windows and its saved
//! configuration, so that `--resume DIR` can go on after a crash.
//!
//! By default they live under the user's state directory (`$PPL_STATE_DIR`, else
//! `$XDG_STATE_HOME/ppl`, else `~/.local/state/ppl`), in `runs/<UTC time>`: out of the way of
//! the current directory, and in one place that `ppl runs` lists. `--run-dir DIR` (or
//! `output.run_dir` in YAML) puts a run where the user asks.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::ledger;

/// ppl's state directory (run directories live in its `runs/`).
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PPL_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ppl")
}

/// Where default run directories are made.
pub fn runs_root() -> PathBuf {
    state_dir().join("runs")
}

/// `YYYYMMDD-HHMMSS` of a time, UTC.
pub fn utc_stamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A fresh run directory under `root`, named by the UTC time (a counter added if taken), and
/// claimed by creating it, so two runs started in the same second get different ones.
pub fn claim_new(root: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    let stamp = utc_stamp(SystemTime::now());
    let mut last = None;
    for i in 0..1000 {
        let p = match i {
            0 => root.join(&stamp),
            i => root.join(format!("{stamp}-{i}")),
        };
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free run directory name")))
}

/// What `ppl runs` shows of one run directory.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub dir: PathBuf,
    /// Last change (the newest ledger write, or the directory itself).
    pub modified: SystemTime,
    /// Distinct windows the ledgers hold.
    pub windows_done: usize,
    /// Windows in the run, as its ledgers record (none written yet: unknown).
    pub windows_total: Option<usize>,
    /// `model.path` of the saved configuration.
    pub model: Option<String>,
    /// The command that resumes it: `ppl compare` when its ledgers name a base, else `ppl eval`.
    pub command: &'static str,
}

/// Any ledger record's window index (eval's and compare's records both carry one).
#[derive(serde::Deserialize)]
struct IndexOnly {
    index: usize,
}

/// The run directories under `root`, newest first. Unreadable entries are skipped: this is a
/// listing, not a check (`ppl eval --resume` checks a ledger in full).
pub fn list(root: &Path) -> Vec<RunSummary> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut runs: Vec<RunSummary> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|dir| summarize(&dir))
        .collect();
    runs.sort_by(|a, b| b.modified.cmp(&a.modified).then(b.dir.cmp(&a.dir)));
    runs
}

fn summarize(dir: &Path) -> RunSummary {
    let mut modified = std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut done = std::collections::BTreeSet::new();
    let mut total = None;
    let mut command = "ppl eval";
    for file in ledger::files(dir).unwrap_or_default() {
        if let Ok(t) = std::fs::metadata(&file).and_then(|m| m.modified()) {
            modified = modified.max(t);
        }
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        if let Ok(c) = ledger::parse_records::<IndexOnly>(&file, &bytes) {
            total = Some(c.header.binding.windows);
            if c.header.binding.base.is_some() {
                command = "ppl compare";
            }
            done.extend(c.records.iter().map(|r| r.index));
        }
    }
    let model = std::fs::read_to_string(dir.join("config.yaml"))
        .ok()
        .and_then(|text| model_path_of(&text));
    RunSummary {
        dir: dir.to_path_buf(),
        modified,
        windows_done: done.len(),
        windows_total: total,
        model,
        command,
    }
}

/// `model.path` of a saved configuration (written by ppl: `model:` then `  path: …`).
fn model_path_of(yaml: &str) -> Option<String> {
    let mut in_model = false;
    for line in yaml.lines() {
        if !line.starts_with(' ') {
            in_model = line.trim_end() == "model:";
        } else if in_model {
            if let Some(p) = line.trim().strip_prefix("path:") {
                return Some(p.trim().trim_matches('"').to_string());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_civil_time() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        assert_eq!(utc_stamp(t), "20261118-110640");
        assert_eq!(utc_stamp(SystemTime::UNIX_EPOCH), "19700101-000000");
        // A leap day.
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(utc_stamp(t), "20000229-000000");
    }

    #[test]
    fn new_directories_are_claimed_and_listed_newest_first() {
        let root = std::env::temp_dir().join(format!("ppl-runs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let a = claim_new(&root).unwrap();
        let b = claim_new(&root).unwrap();
        assert_ne!(a, b);
        std::fs::write(
            b.join("config.yaml"),
            "model:\n  path: /m/x.gguf\n  format: gguf\ndata:\n  path: /d\n",
        )
        .unwrap();
        let runs = list(&root);
        assert_eq!(runs.len(), 2);
        assert!(runs
            .iter()
            .any(|r| r.dir == b && r.model.as_deref() == Some("/m/x.gguf")));
        assert!(runs
            .iter()
            .all(|r| r.windows_done == 0 && r.windows_total.is_none()));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
