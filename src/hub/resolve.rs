//! A model name to the local path ppl opens.
//!
//! - `hf:ORG/NAME-GGUF:QUANT` — the GGUF file whose name carries the quantization as a
//!   whole word (`Q4_K` matches `x-Q4_K.gguf`, not `x-Q4_K_M.gguf`), case-insensitive;
//!   `hf:ORG/NAME:FILE.gguf` names the file. Several matches are an error that lists them.
//! - `hf:ORG/NAME` — a checkpoint: `config.json`, the tokenizer files, and the safetensors
//!   shards `model.safetensors.index.json` names (or every top-level `.safetensors` file);
//!   the path is the snapshot directory.
//!
//! The revision is resolved to a commit once, and every file is fetched at that commit, so
//! the files of one run always come from one snapshot, even if the branch moves meanwhile.

use std::path::PathBuf;

use super::download::{fetch_file, CachedFile};
use super::http::HubClient;
use super::{HubError, HubName, HubSettings, RepoKind, Selector};

/// A model name resolved to local files.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// The GGUF file or the checkpoint directory.
    pub path: PathBuf,
    pub repo: String,
    pub commit: String,
    /// The repository files fetched.
    pub files: Vec<String>,
}

/// Files a checkpoint reader may read besides the weights, fetched when the repository has
/// them.
const CHECKPOINT_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "model.safetensors.index.json",
];

/// The commit a name's revision points at and the repository's files: from the hub, or
/// from the cache offline (or when the hub cannot be reached and the cache has it).
pub fn snapshot_listing(
    client: &HubClient,
    name: &HubName,
) -> Result<(String, Vec<String>), HubError> {
    let s = client.settings;
    let from_cache = || {
        let commit = s.cache.commit_of(name.kind, &name.repo, &name.revision)?;
        let files = s.cache.snapshot_files(name.kind, &name.repo, &commit);
        (!files.is_empty()).then_some((commit, files))
    };
    if s.offline {
        return from_cache().ok_or_else(|| HubError::OfflineMissing {
            what: format!(
                "{} repository '{}' at '{}'",
                name.kind, name.repo, name.revision
            ),
            cache: s.cache.root.clone(),
        });
    }
    match client.repo_info(name) {
        Ok(info) => {
            s.cache
                .write_ref(name.kind, &name.repo, &name.revision, &info.commit)?;
            Ok((info.commit, info.files))
        }
        Err(e @ HubError::Network { .. }) => from_cache()
            .inspect(|_| tracing::warn!("{e}; using the cached snapshot of {}", name.repo))
            .ok_or(e),
        Err(e) => Err(e),
    }
}

/// Resolves a model name, downloading what the cache lacks.
pub fn resolve_model(settings: &HubSettings, name: &HubName) -> Result<ResolvedModel, HubError> {
    let client = HubClient::new(settings);
    let (commit, files) = snapshot_listing(&client, name)?;
    let wanted = match &name.selector {
        Some(sel) => choose_gguf(&files, sel, name, &commit)?,
        None => checkpoint_files(&files, name, &commit)?,
    };
    let mut fetched: Vec<CachedFile> = Vec::with_capacity(wanted.len());
    for f in &wanted {
        fetched.push(fetch_file(
            &client,
            RepoKind::Model,
            &name.repo,
            &commit,
            f,
        )?);
    }
    let path = match &name.selector {
        Some(_) => fetched[0].path.clone(),
        None => settings
            .cache
            .snapshot_dir(RepoKind::Model, &name.repo, &commit),
    };
    Ok(ResolvedModel {
        path,
        repo: name.repo.clone(),
        commit,
        files: wanted,
    })
}

fn is_gguf(f: &str) -> bool {
    f.to_ascii_lowercase().ends_with(".gguf")
}

/// `x-00002-of-00003.gguf` → (`x`, 2, 3).
fn split_part(f: &str) -> Option<(&str, u32, u32)> {
    let stem = f.get(..f.len().checked_sub(5)?)?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (base, part) = rest.rsplit_once('-')?;
    let ok = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (ok(part) && ok(total)).then(|| (base, part.parse().unwrap_or(0), total.parse().unwrap_or(0)))
}

/// Does the file's path carry `quant` as a whole word (bounded by anything but a letter,
/// a digit or `_`)?
fn names_quant(file: &str, quant: &str) -> bool {
    let (f, q) = (file.to_ascii_uppercase(), quant.to_ascii_uppercase());
    let word = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
    f.match_indices(&q)
        .any(|(i, _)| word(f[..i].chars().next_back()) && word(f[i + q.len()..].chars().next()))
}

fn listing(files: &[String]) -> String {
    let g: Vec<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|f| is_gguf(f))
        .collect();
    if g.is_empty() {
        "; it holds no GGUF file".to_string()
    } else {
        format!("; its GGUF files: {}", g.join(", "))
    }
}

/// The GGUF file (all its parts, in order, when split) a selector names.
fn choose_gguf(
    files: &[String],
    sel: &Selector,
    name: &HubName,
    commit: &str,
) -> Result<Vec<String>, HubError> {
    let matches: Vec<&String> = match sel {
        Selector::File(want) if !super::name::is_safe_repo_path(want) => Vec::new(),
        Selector::File(want) => files
            .iter()
            .filter(|f| *f == want || f.eq_ignore_ascii_case(want))
            .take(1)
            .collect(),
        Selector::Quant(q) => files
            .iter()
            .filter(|f| is_gguf(f) && names_quant(f, q))
            .collect(),
    };
    if matches.is_empty() {
        let what = match sel {
            Selector::File(f) => f.clone(),
            Selector::Quant(q) => format!("a GGUF file of quantization {q}"),
        };
        return Err(HubError::FileNotFound {
            kind: name.kind,
            repo: name.repo.clone(),
            revision: format!("{} (commit {commit})", name.revision),
            file: what,
            listing: listing(files),
        });
    }
    // Distinct models: split parts count as one.
    let mut models: Vec<&str> = matches
        .iter()
        .map(|f| split_part(f).map_or(f.as_str(), |(base, _, _)| base))
        .collect();
    models.dedup();
    if models.len() > 1 {
        let names: Vec<&str> = matches.iter().map(|s| s.as_str()).collect();
        return Err(HubError::Choice(format!(
            "{} files of '{}' match: {}; name one with hf:{}:FILE.gguf",
            names.len(),
            name.repo,
            names.join(", "),
            name.repo
        )));
    }
    let mut parts: Vec<String> = matches.into_iter().cloned().collect();
    parts.sort();
    if let Some((_, _, total)) = split_part(&parts[0]) {
        let numbers: Vec<u32> = parts
            .iter()
            .filter_map(|p| split_part(p))
            .map(|s| s.1)
            .collect();
        if numbers != (1..=total).collect::<Vec<u32>>() {
            return Err(HubError::Choice(format!(
                "'{}' is split into {total} parts but the repository has parts {numbers:?}",
                parts[0]
            )));
        }
        if total > 1 {
            return Err(HubError::Choice(format!(
                "'{}' is split into {total} files; ppl reads one GGUF file: merge the parts with llama.cpp's `llama-gguf-split --merge {} merged.gguf` and give that file",
                parts[0], parts[0]
            )));
        }
    }
    Ok(parts)
}

/// The files of a checkpoint repository ppl reads.
fn checkpoint_files(
    files: &[String],
    name: &HubName,
    commit: &str,
) -> Result<Vec<String>, HubError> {
    let has = |f: &str| files.iter().any(|x| x == f);
    if !has("config.json") {
        let gguf = files.iter().any(|f| is_gguf(f));
        return Err(if gguf {
            HubError::Choice(format!(
                "'{}' holds GGUF files, not a checkpoint: name one with hf:{}:QUANT or hf:{}:FILE.gguf{}",
                name.repo,
                name.repo,
                name.repo,
                listing(files)
            ))
        } else {
            HubError::FileNotFound {
                kind: name.kind,
                repo: name.repo.clone(),
                revision: format!("{} (commit {commit})", name.revision),
                file: "config.json".into(),
                listing: "; a checkpoint repository has config.json and safetensors files".into(),
            }
        });
    }
    let mut out: Vec<String> = CHECKPOINT_FILES
        .iter()
        .filter(|f| has(f))
        .map(|f| f.to_string())
        .collect();
    let shards: Vec<String> = files
        .iter()
        .filter(|f| !f.contains('/') && f.ends_with(".safetensors"))
        .cloned()
        .collect();
    if shards.is_empty() {
        return Err(HubError::FileNotFound {
            kind: name.kind,
            repo: name.repo.clone(),
            revision: format!("{} (commit {commit})", name.revision),
            file: "*.safetensors".into(),
            listing: "; ppl reads safetensors weights (not .bin or .pt files)".into(),
        });
    }
    out.extend(shards);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn quantizations_match_as_whole_words() {
        assert!(names_quant("Qwen3-0.6B-Q4_K_M.gguf", "q4_k_m"));
        assert!(!names_quant("Qwen3-0.6B-Q4_K_M.gguf", "Q4_K"));
        assert!(names_quant("Q8_0/model-00001-of-00002.gguf", "Q8_0"));
        assert!(!names_quant("model-IQ4_XS.gguf", "Q4_XS"));
        assert_eq!(split_part("a/m-00002-of-00003.gguf"), Some(("a/m", 2, 3)));
        assert_eq!(split_part("m-Q4_0.gguf"), None);
    }

    #[test]
    fn a_selector_names_one_model_or_says_what_there_is() {
        let name = HubName::parse("hf:o/n-GGUF:Q4_K_M").unwrap();
        let f = files(&["README.md", "n-Q4_K_M.gguf", "n-Q4_K_S.gguf", "n-Q8_0.gguf"]);
        let sel = |q: &str| Selector::Quant(q.into());
        assert_eq!(
            choose_gguf(&f, &sel("q4_k_m"), &name, "c").unwrap(),
            vec!["n-Q4_K_M.gguf"]
        );
        let e = choose_gguf(&f, &sel("Q5_K_M"), &name, "c")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("n-Q4_K_M.gguf, n-Q4_K_S.gguf, n-Q8_0.gguf"),
            "{e}"
        );
        let two = files(&["a-Q8_0.gguf", "b-Q8_0.gguf"]);
        let e = choose_gguf(&two, &sel("Q8_0"), &name, "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("name one with hf:o/n-GGUF:FILE.gguf"), "{e}");
        let file = Selector::File("n-Q8_0.gguf".into());
        assert_eq!(
            choose_gguf(&f, &file, &name, "c").unwrap(),
            vec!["n-Q8_0.gguf"]
        );
        let split = files(&["Q2/m-00001-of-00002.gguf", "Q2/m-00002-of-00002.gguf"]);
        let e = choose_gguf(&split, &sel("Q2"), &name, "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("llama-gguf-split --merge"), "{e}");
    }

    #[test]
    fn checkpoints_take_config_tokenizer_and_shards() {
        let name = HubName::parse("hf:o/n").unwrap();
        let f = files(&[
            "config.json",
            "tokenizer.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "onnx/model.safetensors",
            "pytorch_model.bin",
        ]);
        assert_eq!(
            checkpoint_files(&f, &name, "c").unwrap(),
            files(&[
                "config.json",
                "tokenizer.json",
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
            ])
        );
        let e = checkpoint_files(&files(&["x-Q4_0.gguf"]), &name, "c")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("holds GGUF files") && e.contains("x-Q4_0.gguf"),
            "{e}"
        );
        let e = checkpoint_files(&files(&["config.json", "pytorch_model.bin"]), &name, "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("safetensors"), "{e}");
    }
}
