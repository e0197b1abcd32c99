//! The environment the hub client reads, with Python's `huggingface_hub` precedence:
//!
//! | setting | variables, first set wins | default |
//! |---|---|---|
//! | endpoint | `HF_ENDPOINT` | `https://huggingface.co` |
//! | cache | `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub` | `$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub` |
//! | token | `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, the file `HF_TOKEN_PATH` or `$HF_HOME/token` | none |
//! | offline | `HF_HUB_OFFLINE` (`1`, `true`, `yes`, `on`) | online |

use std::path::PathBuf;

use super::HubCache;

/// Every wait on the network has a bound: connecting, and each read of a response.
pub const CONNECT_TIMEOUT_S: u64 = 20;
pub const READ_TIMEOUT_S: u64 = 60;

#[derive(Debug, Clone)]
pub struct HubSettings {
    /// Without a trailing slash.
    pub endpoint: String,
    pub cache: HubCache,
    pub token: Option<String>,
    pub offline: bool,
    /// Draw a progress bar (a terminal on stderr); otherwise one line per download.
    pub progress_bar: bool,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `huggingface_hub`'s truth test for flags.
fn is_true(v: Option<String>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> PathBuf {
    if let Some(h) = var("HF_HOME") {
        return PathBuf::from(h);
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("huggingface")
}

/// The hub cache directory the environment names.
pub fn cache_dir() -> PathBuf {
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

fn token() -> Option<String> {
    if let Some(t) = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")) {
        return Some(t.trim().to_string());
    }
    let path = var("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
}

impl HubSettings {
    pub fn from_env() -> Self {
        use std::io::IsTerminal;
        Self {
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim_end_matches('/').to_string())
                .unwrap_or_else(|| "https://huggingface.co".to_string()),
            cache: HubCache::new(cache_dir()),
            token: token(),
            offline: is_true(var("HF_HUB_OFFLINE")),
            progress_bar: std::io::stderr().is_terminal(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_flag_reads_as_python_reads_it() {
        for v in ["1", "true", "YES", " on "] {
            assert!(is_true(Some(v.into())), "{v}");
        }
        for v in ["0", "false", "no", "2"] {
            assert!(!is_true(Some(v.into())), "{v}");
        }
        assert!(!is_true(None));
    }
}
