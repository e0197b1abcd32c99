//! The hub cache as Python's `huggingface_hub` lays it out, read and written the same way:
//!
//! ```text
//! {cache}/models--ORG--NAME/            (datasets--ORG--NAME for datasets)
//!     blobs/{etag}                      one file per content; {etag}.incomplete while downloading
//!     refs/{revision}                   the commit a branch or tag pointed at when last resolved
//!     snapshots/{commit}/{path}         a relative symlink to ../../blobs/{etag}
//! {cache}/.locks/models--ORG--NAME/{etag}.lock
//! ```
//!
//! A snapshot entry exists only once its blob is complete and checked, so a path under
//! `snapshots/` is always a whole file.

use std::path::{Path, PathBuf};

use super::name::is_commit_hash;
use super::{HubError, RepoKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubCache {
    pub root: PathBuf,
}

/// `models--ORG--NAME` → (model, `ORG/NAME`), as Python reads a folder name back.
pub fn parse_repo_folder(folder: &str) -> Option<(RepoKind, String)> {
    let (kind, rest) = folder.split_once("--")?;
    let kind = match kind {
        "models" => RepoKind::Model,
        "datasets" => RepoKind::Dataset,
        _ => return None,
    };
    let repo = rest.split("--").collect::<Vec<_>>().join("/");
    (!repo.is_empty()).then_some((kind, repo))
}

/// Writes `bytes` to `path` through a temporary file and a rename: a reader sees the old
/// content or the new, never a part.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), HubError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).map_err(|e| HubError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| HubError::io(path, e))
}

impl HubCache {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub fn repo_dir(&self, kind: RepoKind, repo: &str) -> PathBuf {
        self.root
            .join(format!("{}--{}", kind.plural(), repo.replace('/', "--")))
    }

    pub fn snapshot_dir(&self, kind: RepoKind, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(kind, repo).join("snapshots").join(commit)
    }

    pub fn blob(&self, kind: RepoKind, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(kind, repo).join("blobs").join(etag)
    }

    pub fn lock_file(&self, kind: RepoKind, repo: &str, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(format!("{}--{}", kind.plural(), repo.replace('/', "--")))
            .join(format!("{etag}.lock"))
    }

    /// The commit a revision names in the cache: the revision itself when it is a commit
    /// hash, else what `refs/{revision}` recorded.
    pub fn commit_of(&self, kind: RepoKind, repo: &str, revision: &str) -> Option<String> {
        if is_commit_hash(revision) {
            return Some(revision.to_string());
        }
        let r = std::fs::read_to_string(self.repo_dir(kind, repo).join("refs").join(revision));
        let c = r.ok()?.trim().to_string();
        is_commit_hash(&c).then_some(c)
    }

    /// Records that `revision` pointed at `commit` (nothing to record for a commit hash).
    pub fn write_ref(
        &self,
        kind: RepoKind,
        repo: &str,
        revision: &str,
        commit: &str,
    ) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir(kind, repo).join("refs").join(revision);
        if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            return Ok(());
        }
        write_atomic(&path, commit.as_bytes())
    }

    /// A whole file of the snapshot `revision` resolves to, if the cache has it.
    pub fn cached_file(
        &self,
        kind: RepoKind,
        repo: &str,
        revision: &str,
        file: &str,
    ) -> Option<PathBuf> {
        let commit = self.commit_of(kind, repo, revision)?;
        let p = self.snapshot_dir(kind, repo, &commit).join(file);
        p.is_file().then_some(p)
    }

    /// Points `snapshots/{commit}/{file}` at the blob, by a relative symlink as Python makes
    /// it (a copy where links cannot be made).
    pub fn link(
        &self,
        kind: RepoKind,
        repo: &str,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> Result<PathBuf, HubError> {
        let dest = self.snapshot_dir(kind, repo, commit).join(file);
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
        if dest.is_file() {
            return Ok(dest);
        }
        // Dangling (its blob removed by hand): made again.
        let _ = std::fs::remove_file(&dest);
        let depth = file.split('/').count() + 1;
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(etag);
        #[cfg(unix)]
        let made = std::os::unix::fs::symlink(&target, &dest);
        #[cfg(not(unix))]
        let made = std::fs::copy(self.blob(kind, repo, etag), &dest).map(|_| ());
        match made {
            Ok(()) => Ok(dest),
            // Another process linked it first.
            Err(_) if dest.is_file() => Ok(dest),
            Err(e) => Err(HubError::io(&dest, e)),
        }
    }

    /// The files of a cached snapshot, as repository paths, sorted.
    pub fn snapshot_files(&self, kind: RepoKind, repo: &str, commit: &str) -> Vec<String> {
        let root = self.snapshot_dir(kind, repo, commit);
        let mut out = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.is_file() {
                    if let Ok(rel) = p.strip_prefix(&root) {
                        out.push(rel.to_string_lossy().replace('\\', "/"));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Every cached model snapshot: (repository, commit, its files), for `ppl models`.
    pub fn model_snapshots(&self) -> Vec<(String, String, Vec<String>)> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return out;
        };
        let mut folders: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        folders.sort();
        for folder in folders {
            let Some((RepoKind::Model, repo)) = parse_repo_folder(&folder) else {
                continue;
            };
            let Ok(snaps) = std::fs::read_dir(self.root.join(&folder).join("snapshots")) else {
                continue;
            };
            let mut commits: Vec<String> = snaps
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            commits.sort();
            for commit in commits {
                let files = self.snapshot_files(RepoKind::Model, &repo, &commit);
                out.push((repo.clone(), commit, files));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_and_refs_follow_the_python_layout() {
        let dir = tempfile::tempdir().unwrap();
        let c = HubCache::new(dir.path().to_path_buf());
        assert_eq!(
            c.repo_dir(RepoKind::Dataset, "Salesforce/wikitext"),
            dir.path().join("datasets--Salesforce--wikitext")
        );
        assert_eq!(
            parse_repo_folder("models--HuggingFaceTB--SmolLM2-135M"),
            Some((RepoKind::Model, "HuggingFaceTB/SmolLM2-135M".into()))
        );
        assert_eq!(parse_repo_folder("version.txt"), None);
        let commit = "a".repeat(40);
        assert_eq!(c.commit_of(RepoKind::Model, "o/n", "main"), None);
        c.write_ref(RepoKind::Model, "o/n", "main", &commit)
            .unwrap();
        assert_eq!(
            c.commit_of(RepoKind::Model, "o/n", "main"),
            Some(commit.clone())
        );
        // A blob, linked under two directory depths.
        let blob = c.blob(RepoKind::Model, "o/n", "e1");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, b"bytes").unwrap();
        for f in ["x.gguf", "sub/y.gguf"] {
            let p = c.link(RepoKind::Model, "o/n", &commit, f, "e1").unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"bytes");
        }
        assert_eq!(
            c.snapshot_files(RepoKind::Model, "o/n", &commit),
            vec!["sub/y.gguf".to_string(), "x.gguf".to_string()]
        );
        assert!(c
            .cached_file(RepoKind::Model, "o/n", "main", "x.gguf")
            .is_some());
        assert!(c
            .cached_file(RepoKind::Model, "o/n", "main", "z.gguf")
            .is_none());
    }
}
