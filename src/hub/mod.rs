//! Models and datasets by name from the Hugging Face Hub, through the cache Python's
//! `huggingface_hub` keeps, so that what `transformers`, vLLM or `huggingface-cli` already
//! downloaded is used without a byte of network.
//!
//! - [`name`]: `hf:ORG/NAME[@REVISION][:QUANT | :FILE]` parsed into a [`HubName`].
//! - [`settings`]: the environment Python's client reads (`HF_ENDPOINT`, `HF_HOME`,
//!   `HF_HUB_CACHE`, `HF_TOKEN` and the token file, `HF_HUB_OFFLINE`), read once.
//! - [`cache`]: the cache layout — `models--ORG--NAME/{blobs,refs,snapshots}` — read and
//!   written exactly as Python does, so either side finds the other's files.
//! - [`http`]: the hub's three endpoints (repository info, a file's metadata by `HEAD`
//!   without following redirects, a ranged `GET`), every call with a bounded timeout.
//! - [`download`]: one file into the cache: a lock per blob (N processes naming the same
//!   file make one download), resumed from the `.incomplete` file a cut left, checked
//!   against the hub's hash (SHA-256 for LFS files, the git blob SHA-1 otherwise) before it
//!   is renamed into place, so a partial or corrupt file is never read as a model.
//! - [`resolve`]: a model name to the local path ppl opens: a GGUF file (one quantization of
//!   a GGUF repository, chosen by its name) or a checkpoint directory (config, tokenizer and
//!   the safetensors shards its index names).
//!
//! Why not the `hf-hub` crate: its synchronous API neither verifies what it downloaded nor
//! has an offline mode (its users add one around it), and its errors do not say which
//! repository, revision or file failed. The protocol ppl needs is three requests; the cache
//! layout is Python's, checked by a test that lays one out by hand.

pub mod cache;
pub mod download;
pub mod http;
pub mod name;
pub mod resolve;
pub mod settings;

use std::path::PathBuf;

pub use cache::HubCache;
pub use name::{HubName, RepoKind, Selector};
pub use resolve::{resolve_model, ResolvedModel};
pub use settings::HubSettings;

/// What went wrong reaching or reading the hub; each message names the repository or file
/// and the fix.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("'{name}': {why}; write hf:ORG/NAME, hf:ORG/NAME@REVISION, hf:ORG/NAME-GGUF:QUANT or hf:ORG/NAME:FILE.gguf")]
    BadName { name: String, why: String },
    #[error("{kind} repository '{repo}' was not found on {endpoint} (a typo, or a private repository: set HF_TOKEN to a token that can read it)")]
    RepoNotFound {
        kind: RepoKind,
        repo: String,
        endpoint: String,
    },
    #[error("revision '{revision}' does not exist in {kind} repository '{repo}' (a branch, a tag or a commit hash; the default branch is 'main')")]
    RevisionNotFound {
        kind: RepoKind,
        repo: String,
        revision: String,
    },
    #[error("'{file}' is not in {kind} repository '{repo}' at '{revision}'{listing}")]
    FileNotFound {
        kind: RepoKind,
        repo: String,
        revision: String,
        file: String,
        listing: String,
    },
    #[error("{kind} repository '{repo}' is gated or private and {why}: accept its terms on its page (https://huggingface.co/{repo}), create a read token at https://huggingface.co/settings/tokens, then set HF_TOKEN or run `huggingface-cli login`")]
    Unauthorized {
        kind: RepoKind,
        repo: String,
        why: &'static str,
    },
    #[error("HF_HUB_OFFLINE is set and {what} is not in the cache {cache}: run once without HF_HUB_OFFLINE to download it (or with huggingface-cli download)")]
    OfflineMissing { what: String, cache: PathBuf },
    #[error("cannot reach {url}: {why}; check the network (HF_ENDPOINT names a mirror), or set HF_HUB_OFFLINE=1 to use only what is cached")]
    Network { url: String, why: String },
    #[error("{url}: the hub answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: {why}")]
    Protocol { url: String, why: String },
    #[error("the download of '{file}' from '{repo}' has {found}, the hub states {expected}; the partial file was removed, run again to download it afresh")]
    Corrupt {
        repo: String,
        file: String,
        found: String,
        expected: String,
    },
    #[error("{}: {source}{}", path.display(), disk_hint(source))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("waited {seconds} s for another process's download of '{file}' (lock {}) without progress; if no ppl or huggingface_hub process is downloading it, remove the lock file", lock.display())]
    LockStalled {
        file: String,
        lock: PathBuf,
        seconds: u64,
    },
    #[error("{0}")]
    Choice(String),
}

fn disk_hint(e: &std::io::Error) -> &'static str {
    // ENOSPC: the cache keeps only the finished blobs and the resumable .incomplete file.
    if e.raw_os_error() == Some(28) {
        " (the disk is full: free space, or move the cache with HF_HUB_CACHE; the partial download is kept and resumes on the next run)"
    } else {
        ""
    }
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HubError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Where a file or directory in the hub cache came from, read back from its path
/// (`…/models--ORG--NAME/snapshots/COMMIT/FILE`): results.json records it so a run names
/// exactly what it evaluated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HubOrigin {
    pub kind: RepoKind,
    pub repo: String,
    pub commit: String,
    /// The file within the snapshot (empty for a checkpoint directory).
    pub file: String,
}

impl HubOrigin {
    /// The origin of a path inside a hub cache's snapshot, or `None` for any other path.
    pub fn of_path(path: &std::path::Path) -> Option<Self> {
        let parts: Vec<String> = path
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let at = parts.iter().rposition(|p| p == "snapshots")?;
        let commit = parts.get(at + 1)?;
        let folder = parts.get(at.checked_sub(1)?)?;
        let (kind, repo) = cache::parse_repo_folder(folder)?;
        if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Self {
            kind,
            repo,
            commit: commit.clone(),
            file: parts[at + 2..].join("/"),
        })
    }
}

/// The local path a `--model`/`--base` value names: a hub name (`hf:…`) resolved through
/// the cache (downloading what it lacks), any other value unchanged.
pub fn local_model(value: &std::path::Path) -> Result<PathBuf, HubError> {
    match value.to_str().filter(|s| name::is_hub_name(s)) {
        Some(s) => {
            let settings = HubSettings::from_env();
            Ok(resolve_model(&settings, &HubName::parse(s)?)?.path)
        }
        None => Ok(value.to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn origin_read_back_from_a_snapshot_path() {
        let c = "0123456789abcdef0123456789abcdef01234567";
        let p = format!("/h/hub/models--unsloth--Qwen3-0.6B-GGUF/snapshots/{c}/Q4_K_M/a.gguf");
        let o = HubOrigin::of_path(Path::new(&p)).unwrap();
        assert_eq!(o.kind, RepoKind::Model);
        assert_eq!(o.repo, "unsloth/Qwen3-0.6B-GGUF");
        assert_eq!(o.commit, c);
        assert_eq!(o.file, "Q4_K_M/a.gguf");
        let d = format!("/h/hub/datasets--Salesforce--wikitext/snapshots/{c}");
        let o = HubOrigin::of_path(Path::new(&d)).unwrap();
        assert_eq!(
            (o.kind, o.repo.as_str(), o.file.as_str()),
            (RepoKind::Dataset, "Salesforce/wikitext", "")
        );
        assert_eq!(
            HubOrigin::of_path(Path::new("/tmp/snapshots/x/y.gguf")),
            None
        );
        assert_eq!(HubOrigin::of_path(Path::new("/tmp/model.gguf")), None);
    }
}
