//! YAML run configuration (`--config FILE.yaml`), the torchtune-style schema:
//!
//! ```yaml
//! model: {path: …, format: gguf}
//! data: {path: …, method: chunks|stride|rolling, stride: 256, chunks: -1, max_tokens: …}
//! parallel: {dp_replicate: 1, dp_shard: ${NUM_NODES:-1}, tp: 1, cp: 1, pp: 1}
//! evaluation: {batch_size: 32, max_seq_len: 2048, precision: f32, threads: …, schedule: static, seed: 42,
//!              quantizer: {type: int4_weight_only, groupsize: 256}}
//! output: {dir: runs/…, report: true}
//! ```
//!
//! Processing: `${VAR}` / `${VAR:-default}` are expanded from the environment; the YAML is
//! flattened to dotted keys; `--set key=value` overrides are applied; every key is checked
//! against the option table's keys ([`super::options::schema`]: unknown keys get the closest valid key suggested, values are type- and
//! range-checked, errors carry the key path). Command-line flags win over the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::options::{schema, Kind, EVAL_OPTIONS};

/// A checked scalar.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Bool(bool),
    Str(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => write!(f, "{s}"),
        }
    }
}

/// The checked configuration: dotted key → value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub values: BTreeMap<String, Value>,
    /// Directory of the config file (relative paths in it are relative to it).
    base: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Syntax { path: String, detail: String },
    #[error("{origin}: unknown key '{key}'{hint}")]
    UnknownKey {
        origin: String,
        key: String,
        hint: String,
    },
    #[error("{origin}: '{key}' {detail}")]
    BadValue {
        origin: String,
        key: String,
        detail: String,
    },
    #[error("{origin}: environment variable {var} is not set (write ${{{var}:-default}} to give a default)")]
    UnsetVar { origin: String, var: String },
    #[error("--set takes KEY=VALUE, got '{0}'")]
    SetSyntax(String),
}

/// Levenshtein distance (for "did you mean").
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Largest configuration file read (a real one is well under a kilobyte).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

fn suggestion(key: &str) -> String {
    // A flag that has no key on purpose ('ranks', 'progress') is named with the reason.
    let leaf = key.rsplit('.').next().unwrap_or(key).replace('_', "-");
    if let Some(o) = EVAL_OPTIONS
        .iter()
        .find(|o| o.key.is_none() && o.flag == Some(leaf.as_str()))
    {
        return format!(
            "; --{leaf} has no configuration key ({}): give it on the command line",
            o.one_sided
        );
    }
    // An unknown section is named as one: comparing it with whole keys would suggest an
    // unrelated short leaf ('foo' → 'parallel.cp').
    let section = key.split('.').next().unwrap_or(key);
    let mut sections: Vec<&str> = schema()
        .map(|(k, _)| k.split('.').next().unwrap_or(k))
        .collect();
    sections.dedup();
    if !sections.contains(&section) {
        // A misspelt section ('evalution') still gets the closest whole key below.
        let close = sections
            .iter()
            .any(|s| distance(section, s) <= 2 && section.len() > 2);
        if !close {
            return format!(
                "; '{section}' is not a section: the top level holds {}",
                sections.join(", ")
            );
        }
    }
    let best = schema()
        .map(|(k, _)| {
            (
                distance(key, k).min(
                    distance(
                        key.rsplit('.').next().unwrap_or(key),
                        k.rsplit('.').next().unwrap_or(k),
                    ) + 2,
                ),
                k,
            )
        })
        .min();
    match best {
        Some((d, k)) if d <= 6 => format!("; did you mean '{k}'?"),
        _ => format!(
            "; valid keys: {}",
            schema().map(|(k, _)| k).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Expands `${VAR}` and `${VAR:-default}`.
pub fn expand_env(
    text: &str,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(ConfigError::Syntax {
                path: origin.to_string(),
                detail: "'${' without a closing '}'".into(),
            });
        };
        let inner = &after[..end];
        let (var, default) = match inner.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (inner, None),
        };
        match env(var)
            .filter(|v| !v.is_empty())
            .or(default.map(str::to_string))
        {
            Some(v) => out.push_str(&v),
            None => {
                return Err(ConfigError::UnsetVar {
                    origin: origin.to_string(),
                    var: var.to_string(),
                })
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn flatten(
    prefix: &str,
    y: &Yaml,
    origin: &str,
    out: &mut Vec<(String, Yaml)>,
) -> Result<(), ConfigError> {
    match y {
        Yaml::Hash(h) => {
            for (k, v) in h {
                let k = match k {
                    Yaml::String(s) => s.clone(),
                    other => {
                        return Err(ConfigError::Syntax {
                            path: origin.to_string(),
                            detail: format!("key {other:?} under '{prefix}' is not a string"),
                        })
                    }
                };
                let path = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, origin, out)?;
            }
        }
        Yaml::Null if prefix.is_empty() => {}
        other => out.push((prefix.to_string(), other.clone())),
    }
    Ok(())
}

fn check(key: &str, y: &Yaml, origin: &str) -> Result<Value, ConfigError> {
    let Some((_, kind)) = schema().find(|(k, _)| *k == key) else {
        // A section given a scalar (e.g. `model: x.gguf`) or a key that does not exist.
        return Err(ConfigError::UnknownKey {
            origin: origin.to_string(),
            key: key.to_string(),
            hint: suggestion(key),
        });
    };
    let bad = |detail: String| ConfigError::BadValue {
        origin: origin.to_string(),
        key: key.to_string(),
        detail,
    };
    let text = match y {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Real(r) => Some(r.clone()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    };
    match kind {
        Kind::Path => match y {
            Yaml::String(s) if !s.is_empty() => Ok(Value::Str(s.clone())),
            _ => Err(bad(format!("must be a path, got {}", describe(y)))),
        },
        Kind::Str => match y {
            Yaml::String(s) if !s.is_empty() => Ok(Value::Str(s.clone())),
            _ => Err(bad(format!(
                "must be a non-empty string, got {}",
                describe(y)
            ))),
        },
        Kind::Bool => match y {
            Yaml::Boolean(b) => Ok(Value::Bool(*b)),
            _ => Err(bad(format!("must be true or false, got {}", describe(y)))),
        },
        Kind::Int { min, minus_one } => {
            let i = match y {
                Yaml::Integer(i) => *i,
                Yaml::String(s) => s
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("must be an integer, got '{s}'")))?,
                _ => return Err(bad(format!("must be an integer, got {}", describe(y)))),
            };
            if i == -1 && minus_one {
                Ok(Value::Int(i))
            } else if i < min {
                Err(bad(format!(
                    "must be at least {min}{}, got {i}",
                    if minus_one { " (or -1)" } else { "" }
                )))
            } else {
                Ok(Value::Int(i))
            }
        }
        Kind::Choice(choices) => match text {
            Some(t) if choices().contains(&t) => Ok(Value::Str(t)),
            _ => Err(bad(format!(
                "must be one of {}, got {}",
                choices().join(", "),
                describe(y)
            ))),
        },
    }
}

fn describe(y: &Yaml) -> String {
    match y {
        Yaml::String(s) => format!("'{s}'"),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Real(r) => r.clone(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Array(_) => "a list".into(),
        Yaml::Hash(_) => "a mapping".into(),
        Yaml::Null => "nothing".into(),
        _ => "an unsupported value".into(),
    }
}

impl Config {
    /// Parses YAML text (after `${VAR}` expansion) and applies `--set` overrides.
    pub fn parse(
        text: &str,
        origin: &str,
        sets: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let expanded = expand_env(text, origin, env)?;
        super::yaml_bounds::check(&expanded).map_err(|detail| ConfigError::Syntax {
            path: origin.to_string(),
            detail: format!("refused: the YAML is {detail}"),
        })?;
        let docs = YamlLoader::load_from_str(&expanded).map_err(|e| ConfigError::Syntax {
            path: origin.to_string(),
            detail: e.to_string(),
        })?;
        let mut flat = Vec::new();
        if let Some(doc) = docs.first() {
            if !matches!(doc, Yaml::Hash(_) | Yaml::Null) {
                return Err(ConfigError::Syntax {
                    path: origin.to_string(),
                    detail: "the top level must be a mapping (model:, data:, …)".into(),
                });
            }
            flatten("", doc, origin, &mut flat)?;
        }
        let mut values = BTreeMap::new();
        for (k, v) in &flat {
            values.insert(k.clone(), check(k, v, origin)?);
        }
        for s in sets {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| ConfigError::SetSyntax(s.clone()))?;
            super::yaml_bounds::check(v).map_err(|detail| ConfigError::Syntax {
                path: format!("--set {s}"),
                detail: format!("refused: the value is {detail}"),
            })?;
            let y = YamlLoader::load_from_str(v)
                .ok()
                .and_then(|d| d.into_iter().next())
                .unwrap_or(Yaml::String(v.to_string()));
            values.insert(
                k.trim().to_string(),
                check(k.trim(), &y, &format!("--set {s}"))?,
            );
        }
        Ok(Self { values, base: None })
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path, sets: &[String]) -> Result<Self, ConfigError> {
        use std::io::Read;
        let not_config = |detail: String| ConfigError::Syntax {
            path: path.display().to_string(),
            detail,
        };
        let read_err = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if !meta.is_file() {
            let kind = crate::preflight::special_file_kind(path).unwrap_or("a directory");
            return Err(not_config(format!(
                "{kind}, not a configuration file; --config takes a YAML file (examples in configs/)"
            )));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(not_config(format!(
                "{} bytes, more than any configuration ({MAX_CONFIG_BYTES} at most); --config takes a YAML file (examples in configs/)",
                meta.len()
            )));
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES).read_to_string(&mut text))
            .map_err(read_err)?;
        let mut c = Self::parse(&text, &path.display().to_string(), sets, &|v| {
            std::env::var(v).ok()
        })?;
        c.base = path.parent().map(Path::to_path_buf);
        Ok(c)
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.values.get(key) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.values.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.values.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A path value, relative paths resolved against the config file's directory; a name
    /// (`hf:ORG/NAME`, a dataset such as `wikitext-2`) stays as written unless a file of
    /// that name is there.
    pub fn path(&self, key: &str) -> Option<PathBuf> {
        let raw = self.str(key)?;
        let p = PathBuf::from(raw);
        Some(match &self.base {
            Some(b) if p.is_relative() && !b.as_os_str().is_empty() => {
                let joined = b.join(&p);
                let is_name =
                    crate::hub::name::is_hub_name(raw) || crate::data::named::is_dataset_name(raw);
                if is_name && !joined.exists() {
                    p
                } else {
                    joined
                }
            }
            _ => p,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &str) -> Option<String> {
        match v {
            "NUM_NODES" => Some("2".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn parse(text: &str, sets: &[&str]) -> Result<Config, String> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::parse(text, "c.yaml", &sets, &env).map_err(|e| e.to_string())
    }

    #[test]
    fn interpolation_with_defaults() {
        let c = parse("parallel: {dp_shard: ${NUM_NODES}, dp_replicate: ${REPLICAS:-3}}\ndata: {path: ${EMPTY:-wiki.txt}}", &[]).unwrap();
        assert_eq!(c.int("parallel.dp_shard"), Some(2));
        assert_eq!(c.int("parallel.dp_replicate"), Some(3));
        assert_eq!(c.str("data.path"), Some("wiki.txt"));
        let e = parse("model: {path: ${MODEL}}", &[]).unwrap_err();
        assert!(e.contains("environment variable MODEL is not set"), "{e}");
    }

    #[test]
    fn overrides_win_and_are_checked() {
        let c = parse(
            "evaluation: {batch_size: 32}",
            &["evaluation.batch_size=8", "data.method=stride"],
        )
        .unwrap();
        assert_eq!(c.int("evaluation.batch_size"), Some(8));
        assert_eq!(c.str("data.method"), Some("stride"));
        let e = parse("", &["evaluation.batch_size=zero"]).unwrap_err();
        assert!(
            e.contains(
                "--set evaluation.batch_size=zero: 'evaluation.batch_size' must be an integer"
            ),
            "{e}"
        );
        assert!(parse("", &["novalue"])
            .unwrap_err()
            .contains("--set takes KEY=VALUE"));
    }

    #[test]
    fn unknown_keys_get_the_closest_valid_key() {
        let e = parse("evaluation: {batch_sise: 4}", &[]).unwrap_err();
        assert!(
            e.contains(
                "unknown key 'evaluation.batch_sise'; did you mean 'evaluation.batch_size'?"
            ),
            "{e}"
        );
        let e = parse("evalution: {batch_size: 4}", &[]).unwrap_err();
        assert!(e.contains("did you mean 'evaluation.batch_size'?"), "{e}");
        let e = parse("parallel: {ranks: 2}", &[]).unwrap_err();
        assert!(
            e.contains("unknown key 'parallel.ranks'; --ranks has no configuration key (the world size: in a file, parallel.dp_replicate"),
            "{e}"
        );
        let e = parse("", &["print_chunks=true"]).unwrap_err();
        assert!(
            e.contains("--print-chunks has no configuration key (display only"),
            "{e}"
        );
        let e = parse("model: m.gguf", &[]).unwrap_err();
        assert!(e.contains("unknown key 'model'"), "{e}");
    }

    #[test]
    fn types_and_ranges_name_the_key() {
        let e = parse("evaluation: {max_seq_len: 1}", &[]).unwrap_err();
        assert!(
            e.contains("c.yaml: 'evaluation.max_seq_len' must be at least 2, got 1"),
            "{e}"
        );
        let e = parse("data: {method: sliding}", &[]).unwrap_err();
        assert!(
            e.contains(
                "'data.method' must be one of chunks, stride, rolling, disjoint, got 'sliding'"
            ),
            "{e}"
        );
        let e = parse("output: {report: maybe}", &[]).unwrap_err();
        assert!(e.contains("'output.report' must be true or false"), "{e}");
        assert_eq!(
            parse("data: {chunks: -1}", &[]).unwrap().int("data.chunks"),
            Some(-1)
        );
        let e = parse("data: [1, 2", &[]).unwrap_err();
        assert!(e.starts_with("c.yaml:"), "{e}");
    }
}
