//! One file of a repository into the cache, so that it is downloaded once, whole and checked:
//!
//! 1. `HEAD` gives the file's commit, content hash (the blob's name) and size. A blob the
//!    cache already has is linked into the snapshot with no download.
//! 2. A lock per blob (`.locks/…/{etag}.lock`, `flock`): of N processes naming the same
//!    file — the ranks of an MPI run — one downloads and the others wait, then find the
//!    blob. The wait is bounded: it ends with an error when the download in progress makes
//!    no progress for [`lock_stall_seconds`].
//! 3. The bytes go to `blobs/{etag}.incomplete`, resumed with a range request from what an
//!    earlier cut left (up to [`ATTEMPTS`] tries in one run; the next run resumes too).
//! 4. Size and hash are checked — SHA-256 for LFS files, the git blob SHA-1 for the rest —
//!    and only then is the file renamed to `blobs/{etag}` and linked from `snapshots/`. A
//!    mismatch removes the partial file. A full disk leaves the cache as it was plus the
//!    resumable partial file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha1::Digest as _;

use super::http::{FileMeta, HubClient};
use super::{HubError, RepoKind};

/// Tries per file within one run (each resumes where the last stopped).
pub const ATTEMPTS: usize = 3;

/// How long a process waits for another's download that makes no progress
/// (`PPL_HUB_LOCK_STALL_S`, default 600 s).
pub fn lock_stall_seconds() -> u64 {
    std::env::var("PPL_HUB_LOCK_STALL_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

/// A whole file in the cache's snapshot and the commit it belongs to.
#[derive(Debug, Clone)]
pub struct CachedFile {
    pub path: PathBuf,
    pub commit: String,
}

/// One file of a repository at a revision, from the cache or downloaded into it.
pub fn fetch_file(
    client: &HubClient,
    kind: RepoKind,
    repo: &str,
    revision: &str,
    file: &str,
) -> Result<CachedFile, HubError> {
    let s = client.settings;
    let cached = || {
        let commit = s.cache.commit_of(kind, repo, revision)?;
        let path = s.cache.cached_file(kind, repo, revision, file)?;
        Some(CachedFile { path, commit })
    };
    if s.offline {
        return cached().ok_or_else(|| HubError::OfflineMissing {
            what: format!("'{file}' of {kind} repository '{repo}' at '{revision}'"),
            cache: s.cache.root.clone(),
        });
    }
    let meta = match client.file_meta(kind, repo, revision, file) {
        Ok(m) => m,
        Err(e @ HubError::Network { .. }) => {
            // As huggingface_hub does: a file already cached is used when the hub cannot be
            // reached.
            return cached()
                .inspect(|_| tracing::warn!("{e}; using the cached copy of {repo}/{file}"))
                .ok_or(e);
        }
        Err(e) => return Err(e),
    };
    let blob = s.cache.blob(kind, repo, &meta.etag);
    if !blob.is_file() {
        let partial = partial_path(&blob);
        let _lock = Lock::acquire(&s.cache.lock_file(kind, repo, &meta.etag), &partial, file)?;
        if !blob.is_file() {
            download_blob(client, kind, repo, file, &meta, &blob)?;
        }
    }
    s.cache.write_ref(kind, repo, revision, &meta.commit)?;
    let path = s.cache.link(kind, repo, &meta.commit, file, &meta.etag)?;
    Ok(CachedFile {
        path,
        commit: meta.commit,
    })
}

fn partial_path(blob: &Path) -> PathBuf {
    let mut p = blob.as_os_str().to_owned();
    p.push(".incomplete");
    PathBuf::from(p)
}

/// An exclusive `flock` on a lock file, released when dropped (or when the process dies, so
/// a crashed download never leaves a lock behind).
struct Lock(std::fs::File);

impl Lock {
    fn acquire(path: &Path, watched: &Path, file: &str) -> Result<Self, HubError> {
        use std::os::fd::AsRawFd;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| HubError::io(path, e))?;
        let stall = Duration::from_secs(lock_stall_seconds());
        let mut last_size = None;
        let mut last_progress = Instant::now();
        let mut told = false;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is shared.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Self(f));
            }
            if !told {
                eprintln!("waiting for another process's download of {file} …");
                told = true;
            }
            let size = std::fs::metadata(watched).ok().map(|m| m.len());
            if size != last_size {
                last_size = size;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall {
                return Err(HubError::LockStalled {
                    file: file.to_string(),
                    lock: path.to_path_buf(),
                    seconds: stall.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in acquire.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Shows a download's progress: a bar with bytes/s on a terminal, else a line at the start
/// and one at the end.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    start: Instant,
    name: String,
}

impl Progress {
    fn new(show_bar: bool, name: &str, size: u64, from: u64) -> Self {
        let bar = show_bar.then(|| {
            let b = indicatif::ProgressBar::new(size);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_message(name.to_string());
            b.set_position(from);
            b
        });
        if bar.is_none() {
            let resumed = if from > 0 {
                format!(", resuming at {from} bytes")
            } else {
                String::new()
            };
            eprintln!("downloading {name} ({size} bytes{resumed})");
        }
        Self {
            bar,
            start: Instant::now(),
            name: name.to_string(),
        }
    }

    fn add(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    fn finish(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        let s = self.start.elapsed().as_secs_f64().max(1e-3);
        eprintln!(
            "downloaded {} ({bytes} bytes in {s:.1} s, {:.1} MB/s)",
            self.name,
            bytes as f64 / s / 1e6
        );
    }
}

/// Downloads into `{blob}.incomplete` (resuming), checks it and renames it to `blob`.
fn download_blob(
    client: &HubClient,
    kind: RepoKind,
    repo: &str,
    file: &str,
    meta: &FileMeta,
    blob: &Path,
) -> Result<(), HubError> {
    let partial = partial_path(blob);
    if let Some(dir) = blob.parent() {
        std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    }
    let name = format!("{repo}/{file}");
    let mut last_err = None;
    for _ in 0..ATTEMPTS {
        let have = std::fs::metadata(&partial).map_or(0, |m| m.len());
        let have = if have > meta.size { 0 } else { have };
        if have < meta.size || meta.size == 0 {
            match transfer(client, (kind, repo, file), meta, &partial, have, &name) {
                Ok(()) => {}
                // Cut: what arrived stays for the next try.
                Err(e @ (HubError::Network { .. } | HubError::Protocol { .. })) => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        let got = std::fs::metadata(&partial).map_or(0, |m| m.len());
        if got != meta.size {
            last_err = Some(HubError::Protocol {
                url: meta.url.clone(),
                why: format!(
                    "the download of '{file}' stopped at {got} of {} bytes; run again to resume it",
                    meta.size
                ),
            });
            continue;
        }
        verify(&partial, meta).map_err(|(found, expected)| {
            let _ = std::fs::remove_file(&partial);
            HubError::Corrupt {
                repo: repo.to_string(),
                file: file.to_string(),
                found,
                expected,
            }
        })?;
        return std::fs::rename(&partial, blob).map_err(|e| HubError::io(blob, e));
    }
    Err(last_err.unwrap_or_else(|| HubError::Protocol {
        url: meta.url.clone(),
        why: "the download did not complete".into(),
    }))
}

/// One request's bytes appended to the partial file (or written afresh when the server
/// ignores the range).
fn transfer(
    client: &HubClient,
    (kind, repo, file): (RepoKind, &str, &str),
    meta: &FileMeta,
    partial: &Path,
    have: u64,
    name: &str,
) -> Result<(), HubError> {
    let (resp, ranged) = client.get(kind, repo, file, &meta.url, have)?;
    let from = if ranged { have } else { 0 };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(ranged)
        .truncate(!ranged)
        .open(partial)
        .map_err(|e| HubError::io(partial, e))?;
    let progress = Progress::new(client.settings.progress_bar, name, meta.size, from);
    let mut reader = resp.into_reader();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = from;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                out.flush().map_err(|e| HubError::io(partial, e))?;
                return Err(HubError::Network {
                    url: meta.url.clone(),
                    why: format!(
                        "the transfer was cut at {total} of {} bytes ({e})",
                        meta.size
                    ),
                });
            }
        };
        out.write_all(&buf[..n])
            .map_err(|e| HubError::io(partial, e))?;
        total += n as u64;
        progress.add(n as u64);
    }
    out.sync_all().map_err(|e| HubError::io(partial, e))?;
    progress.finish(total - from);
    Ok(())
}

/// Checks the file against the hash its ETag states: SHA-256 (64 hex digits) or the git
/// blob SHA-1 (40). Err((found, expected)).
fn verify(path: &Path, meta: &FileMeta) -> Result<(), (String, String)> {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let io = |e: std::io::Error| (format!("an unreadable file ({e})"), meta.etag.clone());
    match meta.etag.len() {
        64 if hex(&meta.etag) => {
            let found = crate::sha256::of_file(path).map_err(io)?;
            (found == meta.etag.to_ascii_lowercase())
                .then_some(())
                .ok_or((format!("SHA-256 {found}"), format!("SHA-256 {}", meta.etag)))
        }
        40 if hex(&meta.etag) => {
            let found = git_blob_sha1(path).map_err(io)?;
            (found == meta.etag.to_ascii_lowercase())
                .then_some(())
                .ok_or((
                    format!("git SHA-1 {found}"),
                    format!("git SHA-1 {}", meta.etag),
                ))
        }
        // A mirror's own ETag: only the size can be checked (done by the caller).
        _ => Ok(()),
    }
}

/// `sha1("blob {len}\0" + content)`: the id git gives a file, which the hub sends as the
/// ETag of files stored outside LFS.
fn git_blob_sha1(path: &Path) -> std::io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {len}\0").as_bytes());
    crate::sha256::digest_of_file(h, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_ids_match_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        assert_eq!(
            git_blob_sha1(&p).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }
}
