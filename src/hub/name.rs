//! `hf:ORG/NAME[@REVISION][:SELECTOR]`: a repository on the hub, the revision to read
//! (a branch, a tag or a commit; `main` when absent) and, for GGUF repositories, which file:
//! a quantization (`:Q4_K_M`, matched in the file names) or a file (`:NAME.gguf`).

use super::HubError;

/// The prefix that marks a hub name where a path is expected.
pub const PREFIX: &str = "hf:";

/// A model or a dataset repository (they live under different URLs and cache folders).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepoKind {
    Model,
    Dataset,
}

impl RepoKind {
    /// The plural the cache folders and the API use (`models`, `datasets`).
    pub fn plural(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        }
    }
}

impl std::fmt::Display for RepoKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RepoKind::Model => "model",
            RepoKind::Dataset => "dataset",
        })
    }
}

/// Which file of a GGUF repository a name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// A quantization named in the file names (`Q4_K_M`, `q8_0`, `BF16`): case-insensitive.
    Quant(String),
    /// A file by its path in the repository (`Qwen3-0.6B-Q4_K_M.gguf`, `Q4_K_M/x.gguf`).
    File(String),
}

/// A parsed `hf:` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubName {
    pub kind: RepoKind,
    /// `ORG/NAME`.
    pub repo: String,
    pub revision: String,
    pub selector: Option<Selector>,
}

/// Is this `--model`/`--base` value a hub name rather than a path?
pub fn is_hub_name(s: &str) -> bool {
    s.starts_with(PREFIX)
}

impl HubName {
    /// Parses `hf:ORG/NAME[@REVISION][:QUANT|:FILE]` as a model repository.
    pub fn parse(s: &str) -> Result<Self, HubError> {
        let bad = |why: &str| HubError::BadName {
            name: s.to_string(),
            why: why.to_string(),
        };
        let rest = s
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("a hub name starts with hf:"))?;
        let (head, selector) = match rest.split_once(':') {
            Some((h, "")) => {
                return Err(bad(&format!("nothing after ':' in '{h}:'")));
            }
            Some((h, sel)) if sel.to_ascii_lowercase().ends_with(".gguf") => {
                (h, Some(Selector::File(sel.to_string())))
            }
            Some((h, sel)) => (h, Some(Selector::Quant(sel.to_string()))),
            None => (rest, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((_, "")) => return Err(bad("nothing after '@'")),
            Some((_, r)) if !is_safe_repo_path(r) => {
                return Err(bad("a revision is a branch, a tag or a commit hash"))
            }
            Some((repo, r)) => (repo, r.to_string()),
            None => (head, "main".to_string()),
        };
        let mut parts = repo.split('/');
        let (org, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if org.is_empty() || name.is_empty() || parts.next().is_some() {
            return Err(bad("the repository is ORG/NAME"));
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if !repo.chars().all(|c| ok(c) || c == '/') || repo.contains("..") {
            return Err(bad(
                "a repository name holds letters, digits, '-', '_' and '.' only",
            ));
        }
        Ok(Self {
            kind: RepoKind::Model,
            repo: repo.to_string(),
            revision,
            selector,
        })
    }

    /// A dataset repository at a revision.
    pub fn dataset(repo: &str, revision: &str) -> Self {
        Self {
            kind: RepoKind::Dataset,
            repo: repo.to_string(),
            revision: revision.to_string(),
            selector: None,
        }
    }
}

/// Is `path` a repository path that stays inside a snapshot directory (relative, no `..`
/// or empty components)? What the hub names becomes a path in the cache, so anything else
/// is refused.
pub fn is_safe_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Is `s` a full commit hash (a revision the cache can answer without `refs/`)?
pub fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_repository_revision_and_selector() {
        let n = HubName::parse("hf:unsloth/Qwen3-0.6B-GGUF:Q4_K_M").unwrap();
        assert_eq!(n.repo, "unsloth/Qwen3-0.6B-GGUF");
        assert_eq!(n.revision, "main");
        assert_eq!(n.selector, Some(Selector::Quant("Q4_K_M".into())));
        let n = HubName::parse("hf:meta-llama/Llama-3.2-1B@v1.0").unwrap();
        assert_eq!(
            (n.repo.as_str(), n.revision.as_str()),
            ("meta-llama/Llama-3.2-1B", "v1.0")
        );
        assert_eq!(n.selector, None);
        let n = HubName::parse("hf:a/b@0123:sub/x-Q8_0.GGUF").unwrap();
        assert_eq!(n.revision, "0123");
        assert_eq!(n.selector, Some(Selector::File("sub/x-Q8_0.GGUF".into())));
        for bad in [
            "hf:",
            "hf:a",
            "hf:a/b/c",
            "hf:/b",
            "hf:a/b@",
            "hf:a/b:",
            "hf:a/b c",
            "hf:a/../b",
            "a/b",
        ] {
            let e = HubName::parse(bad).unwrap_err().to_string();
            assert!(e.contains("hf:ORG/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn repository_paths_stay_inside_the_snapshot() {
        assert!(is_safe_repo_path("Q4_K_M/model-Q4_K_M.gguf"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\\b",
        ] {
            assert!(!is_safe_repo_path(bad), "{bad}");
        }
    }

    #[test]
    fn commit_hashes_are_forty_lower_hex_digits() {
        assert!(is_commit_hash("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit_hash("main"));
        assert!(!is_commit_hash("0123456789ABCDEF0123456789abcdef01234567"));
    }
}
