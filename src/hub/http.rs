//! The hub's endpoints, as `huggingface_hub` calls them:
//!
//! - `GET  {endpoint}/api/{models|datasets}/{repo}/revision/{rev}` — the commit a revision
//!   points at and the repository's files (`sha`, `siblings[].rfilename`);
//! - `HEAD {endpoint}/[datasets/]{repo}/resolve/{rev}/{file}`, redirects not followed — the
//!   file's commit (`X-Repo-Commit`), content hash (`X-Linked-Etag` for LFS files, else
//!   `ETag`), size (`X-Linked-Size`, else `Content-Length`) and, for LFS files, where its
//!   bytes are (`Location`);
//! - `GET` of those bytes with `Range: bytes=N-` to resume.
//!
//! The hub says why a request failed in `X-Error-Code` (`RepoNotFound`,
//! `RevisionNotFound`, `EntryNotFound`, `GatedRepo`); those become [`HubError`]s that name
//! the repository and the fix. The token goes only to the endpoint's host, never to the
//! storage a download is redirected to.

use std::time::Duration;

use super::name::{is_commit_hash, is_safe_repo_path};
use super::settings::{CONNECT_TIMEOUT_S, READ_TIMEOUT_S};
use super::{HubError, HubName, HubSettings, RepoKind};

/// A repository at a revision: its commit and files.
#[derive(Debug, Clone)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<String>,
}

/// One file's metadata from `HEAD …/resolve/…`.
#[derive(Debug, Clone)]
pub struct FileMeta {
    pub commit: String,
    /// The content hash the cache names the blob by: a SHA-256 (64 hex digits, LFS) or a
    /// git blob SHA-1 (40).
    pub etag: String,
    pub size: u64,
    /// Where the bytes are fetched from.
    pub url: String,
}

pub struct HubClient<'a> {
    pub settings: &'a HubSettings,
    agent: ureq::Agent,
}

/// Percent-encodes all but RFC 3986's unreserved characters (and `/` when `keep_slash`).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or("")
}

/// `W/"abc"` → `abc`.
fn normalize_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// What a failed request's status and `X-Error-Code` mean.
struct Failure<'n> {
    kind: RepoKind,
    repo: &'n str,
    revision: &'n str,
    file: Option<&'n str>,
}

impl<'a> HubClient<'a> {
    pub fn new(settings: &'a HubSettings) -> Self {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(CONNECT_TIMEOUT_S))
            .timeout_read(Duration::from_secs(READ_TIMEOUT_S))
            .user_agent(concat!("ppl/", env!("CARGO_PKG_VERSION")))
            .build();
        Self { settings, agent }
    }

    fn repo_url(&self, kind: RepoKind) -> String {
        match kind {
            RepoKind::Model => self.settings.endpoint.clone(),
            RepoKind::Dataset => format!("{}/datasets", self.settings.endpoint),
        }
    }

    pub fn resolve_url(&self, kind: RepoKind, repo: &str, revision: &str, file: &str) -> String {
        format!(
            "{}/{repo}/resolve/{}/{}",
            self.repo_url(kind),
            encode(revision, false),
            encode(file, true)
        )
    }

    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let r = self.agent.request(method, url);
        match &self.settings.token {
            Some(t) if host_of(url) == host_of(&self.settings.endpoint) => {
                r.set("Authorization", &format!("Bearer {t}"))
            }
            _ => r,
        }
    }

    /// Sends a request; a status ≥ 400 becomes the error it means.
    fn send(
        &self,
        method: &str,
        url: &str,
        range_from: u64,
        f: &Failure,
    ) -> Result<ureq::Response, HubError> {
        let mut req = self.request(method, url);
        if range_from > 0 {
            req = req.set("Range", &format!("bytes={range_from}-"));
        }
        match req.call() {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(code, r)) => Err(self.failure(url, code, r, f)),
            Err(ureq::Error::Transport(t)) => Err(HubError::Network {
                url: url.to_string(),
                why: t.to_string(),
            }),
        }
    }

    fn failure(&self, url: &str, status: u16, r: ureq::Response, f: &Failure) -> HubError {
        let code = r.header("X-Error-Code").unwrap_or("").to_string();
        let (kind, repo) = (f.kind, f.repo.to_string());
        match (status, code.as_str()) {
            (_, "RepoNotFound") => HubError::RepoNotFound {
                kind,
                repo,
                endpoint: self.settings.endpoint.clone(),
            },
            (_, "RevisionNotFound") => HubError::RevisionNotFound {
                kind,
                repo,
                revision: f.revision.to_string(),
            },
            (_, "EntryNotFound") | (404, _) if f.file.is_some() => HubError::FileNotFound {
                kind,
                repo,
                revision: f.revision.to_string(),
                file: f.file.unwrap_or_default().to_string(),
                listing: String::new(),
            },
            (404, _) => HubError::RepoNotFound {
                kind,
                repo,
                endpoint: self.settings.endpoint.clone(),
            },
            (401 | 403, _) => HubError::Unauthorized {
                kind,
                repo,
                why: if self.settings.token.is_some() {
                    "the token set (HF_TOKEN or the token file) cannot read it"
                } else {
                    "no token is set"
                },
            },
            _ => {
                let mut body = r.into_string().unwrap_or_default();
                body.truncate(300);
                HubError::Status {
                    url: url.to_string(),
                    status,
                    body,
                }
            }
        }
    }

    /// The commit `name.revision` points at and the repository's files.
    pub fn repo_info(&self, name: &HubName) -> Result<RepoInfo, HubError> {
        let url = format!(
            "{}/api/{}/{}/revision/{}",
            self.settings.endpoint,
            name.kind.plural(),
            name.repo,
            encode(&name.revision, false)
        );
        let f = Failure {
            kind: name.kind,
            repo: &name.repo,
            revision: &name.revision,
            file: None,
        };
        let r = self.send("GET", &url, 0, &f)?;
        let bad = |why: String| HubError::Protocol {
            url: url.clone(),
            why,
        };
        let body = r
            .into_string()
            .map_err(|e| bad(format!("reading the answer: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| bad(format!("not the JSON of a repository: {e}")))?;
        let commit = v["sha"]
            .as_str()
            .ok_or_else(|| bad("no 'sha' in the repository's information".into()))?
            .to_string();
        if !is_commit_hash(&commit) {
            return Err(bad(format!("'sha' {commit} is not a commit hash")));
        }
        // Only names that stay inside the snapshot directory are listed.
        let files = v["siblings"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|f| f["rfilename"].as_str())
                    .filter(|f| is_safe_repo_path(f))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(RepoInfo { commit, files })
    }

    /// A file's commit, hash, size and download URL. Relative redirects (a renamed
    /// repository) are followed; an absolute one is where the bytes are.
    pub fn file_meta(
        &self,
        kind: RepoKind,
        repo: &str,
        revision: &str,
        file: &str,
    ) -> Result<FileMeta, HubError> {
        let f = Failure {
            kind,
            repo,
            revision,
            file: Some(file),
        };
        let mut url = self.resolve_url(kind, repo, revision, file);
        for _ in 0..5 {
            let r = self.send("HEAD", &url, 0, &f)?;
            let header = |h: &str| r.header(h).map(str::to_string);
            let location = header("Location");
            if let Some(loc) = location.as_deref().filter(|l| l.starts_with('/')) {
                if header("X-Repo-Commit").is_none() {
                    let origin = url
                        .split_once("://")
                        .map(|(s, rest)| format!("{s}://{}", rest.split('/').next().unwrap_or("")));
                    url = format!("{}{loc}", origin.unwrap_or_default());
                    continue;
                }
            }
            let bad = |why: &str| HubError::Protocol {
                url: url.clone(),
                why: why.to_string(),
            };
            let commit = header("X-Repo-Commit").ok_or_else(|| {
                bad("no X-Repo-Commit header: is HF_ENDPOINT a Hugging Face Hub?")
            })?;
            let etag = header("X-Linked-Etag")
                .or_else(|| header("ETag"))
                .map(|e| normalize_etag(&e))
                .ok_or_else(|| bad("no ETag header"))?;
            let size = header("X-Linked-Size")
                .or_else(|| header("Content-Length"))
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| bad("no size (X-Linked-Size, Content-Length)"))?;
            if !is_commit_hash(&commit) {
                return Err(bad("X-Repo-Commit is not a commit hash"));
            }
            if etag.is_empty()
                || !etag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(bad("the ETag is not a content hash"));
            }
            let url = match location {
                Some(l) if l.starts_with('/') => format!("{}{l}", self.settings.endpoint),
                Some(l) => l,
                None => url.clone(),
            };
            return Ok(FileMeta {
                commit,
                etag,
                size,
                url,
            });
        }
        Err(HubError::Protocol {
            url,
            why: "more than 5 redirects".into(),
        })
    }

    /// The bytes at `url` from offset `from`, following redirects. The answer tells whether
    /// the server honoured the range (206) or sent the whole file (200).
    pub fn get(
        &self,
        kind: RepoKind,
        repo: &str,
        file: &str,
        url: &str,
        from: u64,
    ) -> Result<(ureq::Response, bool), HubError> {
        let f = Failure {
            kind,
            repo,
            revision: "",
            file: Some(file),
        };
        let mut url = url.to_string();
        for _ in 0..5 {
            let r = self.send("GET", &url, from, &f)?;
            match r.status() {
                301 | 302 | 303 | 307 | 308 => {
                    let loc = r.header("Location").unwrap_or("").to_string();
                    url = if loc.starts_with('/') {
                        let (scheme, rest) = url.split_once("://").unwrap_or(("http", &url));
                        format!("{scheme}://{}{loc}", rest.split('/').next().unwrap_or(""))
                    } else {
                        loc
                    };
                }
                206 => return Ok((r, true)),
                _ => return Ok((r, false)),
            }
        }
        Err(HubError::Protocol {
            url,
            why: "more than 5 redirects".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_revisions_whole_and_paths_by_segment() {
        assert_eq!(
            encode("refs/convert/parquet", false),
            "refs%2Fconvert%2Fparquet"
        );
        assert_eq!(encode("a b/c.gguf", true), "a%20b/c.gguf");
        assert_eq!(host_of("https://huggingface.co/a/b"), "huggingface.co");
        assert_eq!(host_of("http://127.0.0.1:9/x"), "127.0.0.1:9");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
    }
}
