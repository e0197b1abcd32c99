//! `ppl eval`'s options, each defined once (after ripgrep's `flags/defs.rs`).
//!
//! One row of [`table::EVAL_OPTIONS`] gives an option its long flag, its configuration key
//! and what that key holds ([`Kind`]), its default, its help text and how the resolved value
//! is written back as YAML. From the table come:
//!
//! - the configuration schema ([`schema`]): which keys `--config` files and `--set` accept,
//!   their types and ranges, and the choices of enum keys, taken from the same `ValueEnum`
//!   the flag parses with (so a choice is named in one place, its type);
//! - the layering in [`EvalArgs::resolve`](super::EvalArgs::resolve) ([`Layers`]): the flag,
//!   else the key, else the table's default;
//! - the help of every flag ([`with_table_help`], applied to the clap-derived arguments),
//!   with its `[default: …]`;
//! - the YAML of `ppl config show` and of the run directory's `config.yaml` ([`write_yaml`]).
//!
//! The clap-derived fields of [`EvalArgs`](super::EvalArgs) still give each flag its Rust type,
//! short name and value parser; the tests check that the table and clap agree flag for flag,
//! and that every row is classified for the two bindings of a run (what ranks agree on, what a
//! ledger is bound to) with the classification checked option by option.

#[cfg(test)]
mod binding_tests;
mod table;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use anyhow::anyhow;
use clap::ValueEnum;

use super::config::Config;
use super::eval_args::Resolved;
use crate::model::Scheme;

pub(super) use table::*;

/// What a configuration key holds (checked when a file or `--set` is read).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A path (relative paths are relative to the configuration file).
    Path,
    /// Any non-empty string.
    Str,
    /// An integer ≥ `min`; `-1` allowed where `minus_one` ("all" or "infer").
    Int {
        min: i64,
        minus_one: bool,
    },
    Bool,
    /// One of these names.
    Choice(fn() -> Vec<String>),
}

impl Kind {
    /// An integer of at least `min`.
    pub const fn at_least(min: i64) -> Self {
        Kind::Int {
            min,
            minus_one: false,
        }
    }
}

/// An option's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DefaultValue {
    /// None shown (the option is off or unset until given).
    None,
    /// A value the option's own parser reads: shown in the help and used by `resolve`.
    Value(&'static str),
    /// A default that follows from other options or the machine, described for the help.
    Described(&'static str),
}

/// How an option's resolved value is written back as YAML (`None`: left out).
pub type YamlValue = fn(&YamlView) -> Option<String>;

/// One `ppl eval` option. A row has a flag, a key, or both; one with only one of them says
/// why in `one_sided`.
#[derive(Debug, Clone, Copy)]
pub struct EvalOption {
    /// The long flag, without its dashes.
    pub flag: Option<&'static str>,
    /// The configuration key (dotted path in the YAML file).
    pub key: Option<&'static str>,
    /// What the key holds.
    pub kind: Kind,
    pub default: DefaultValue,
    /// Help text, without the default (appended from `default`).
    pub help: &'static str,
    /// Why the option has a flag but no key, or a key but no flag.
    pub one_sided: &'static str,
    /// The resolved value as YAML.
    pub yaml: Option<YamlValue>,
}

/// The fields every row starts from (`..ROW`).
pub(super) const ROW: EvalOption = EvalOption {
    flag: None,
    key: None,
    kind: Kind::Str,
    default: DefaultValue::None,
    help: "",
    one_sided: "",
    yaml: None,
};

impl EvalOption {
    /// The configuration key, or "" (no value is ever stored under it) for a flag-only option.
    pub fn key(&self) -> &'static str {
        self.key.unwrap_or("")
    }

    /// The help text as `--help` shows it (without a final full stop, as clap writes its own).
    pub fn help_text(&self) -> String {
        let help = self.help.strip_suffix('.').unwrap_or(self.help);
        match self.default {
            DefaultValue::None => help.to_string(),
            DefaultValue::Value(d) | DefaultValue::Described(d) => {
                format!("{help} [default: {d}]")
            }
        }
    }

    fn default_text(&self) -> &'static str {
        match self.default {
            DefaultValue::Value(d) => d,
            // Only reached through a table edit the tests catch (a default parsed that has none).
            _ => "",
        }
    }

    /// The default as a value of `T` (numbers, `DeviceSpec`).
    pub fn default_parsed<T: std::str::FromStr>(&self) -> T {
        self.default_text()
            .parse()
            .ok()
            .expect("every DefaultValue::Value in the option table parses (tested)")
    }

    /// The default as one of an enum's choices.
    pub fn default_choice<T: ValueEnum>(&self) -> T {
        T::from_str(self.default_text(), false)
            .expect("every DefaultValue::Value in the option table parses (tested)")
    }
}

/// The names an enum's flag accepts (which are also its configuration key's choices).
pub fn names<T: ValueEnum>() -> Vec<String> {
    T::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value())
        .map(|p| p.get_name().to_string())
        .collect()
}

/// `evaluation.quantizer.type`'s spelling of a scheme: torchao's names for int4 and int8,
/// the flag's for the GGUF types.
pub fn quantizer_type(s: Scheme) -> String {
    match s {
        Scheme::Int4 => "int4_weight_only".into(),
        Scheme::Int8 => "int8_weight_only".into(),
        s => s.to_string(),
    }
}

/// `evaluation.quantizer.type`'s choices: none and every scheme.
pub fn quantizer_types() -> Vec<String> {
    std::iter::once("none".to_string())
        .chain(Scheme::value_variants().iter().map(|s| quantizer_type(*s)))
        .collect()
}

/// A scheme from its `evaluation.quantizer.type` spelling (`none`: no quantization).
pub fn scheme_from_quantizer_type(t: &str) -> anyhow::Result<Option<Scheme>> {
    if t == "none" {
        return Ok(None);
    }
    Scheme::value_variants()
        .iter()
        .find(|s| quantizer_type(**s) == t)
        .map(|s| Some(*s))
        .ok_or_else(|| {
            anyhow!(
                "evaluation.quantizer.type = {t}: use {}",
                quantizer_types().join(", ")
            )
        })
}

/// The configuration schema: every key and what it holds.
pub fn schema() -> impl Iterator<Item = (&'static str, Kind)> {
    EVAL_OPTIONS
        .iter()
        .filter_map(|o| o.key.map(|k| (k, o.kind)))
}

/// Sets each flag's help from its row (with the default); other arguments pass unchanged.
pub fn with_table_help(arg: clap::Arg) -> clap::Arg {
    let row = arg
        .get_long()
        .and_then(|l| EVAL_OPTIONS.iter().find(|o| o.flag == Some(l)));
    match row {
        Some(o) => arg.help(o.help_text()),
        None => arg,
    }
}

/// The layers under a flag: the configuration (file and `--set`), then the table's default.
pub(super) struct Layers<'a> {
    pub config: &'a Config,
}

impl Layers<'_> {
    /// The flag's count, else the key's (`-1`, "all", reads as unset).
    pub fn count(&self, o: &EvalOption, flag: Option<usize>) -> Option<usize> {
        flag.or_else(|| {
            self.config
                .int(o.key())
                .and_then(|i| usize::try_from(i).ok())
        })
    }

    /// [`Self::count`], else the default.
    pub fn count_or_default(&self, o: &EvalOption, flag: Option<usize>) -> usize {
        self.count(o, flag).unwrap_or_else(|| o.default_parsed())
    }

    /// The flag's integer, else the key's (`-1` kept).
    pub fn int(&self, o: &EvalOption, flag: Option<i64>) -> Option<i64> {
        flag.or_else(|| self.config.int(o.key()))
    }

    pub fn string(&self, o: &EvalOption, flag: Option<&String>) -> Option<String> {
        flag.cloned()
            .or_else(|| self.config.str(o.key()).map(str::to_string))
    }

    pub fn path(&self, o: &EvalOption, flag: Option<&PathBuf>) -> Option<PathBuf> {
        flag.cloned().or_else(|| self.config.path(o.key()))
    }

    /// Whether the key is set (the flag's presence is the caller's).
    pub fn in_config(&self, o: &EvalOption) -> bool {
        self.config.values.contains_key(o.key())
    }

    /// The flag's choice, else the key's, parsed as the flag parses it.
    pub fn choice<T: ValueEnum>(
        &self,
        o: &EvalOption,
        flag: Option<T>,
    ) -> anyhow::Result<Option<T>> {
        if flag.is_some() {
            return Ok(flag);
        }
        match self.config.str(o.key()) {
            None => Ok(None),
            Some(s) => T::from_str(s, false)
                .map(Some)
                .map_err(|_| anyhow!("{} = {s}: use {}", o.key(), names::<T>().join(", "))),
        }
    }

    /// [`Self::choice`], else the default.
    pub fn choice_or_default<T: ValueEnum>(
        &self,
        o: &EvalOption,
        flag: Option<T>,
    ) -> anyhow::Result<T> {
        Ok(self.choice(o, flag)?.unwrap_or_else(|| o.default_choice()))
    }
}

/// What a row's [`YamlValue`] reads.
pub struct YamlView<'a> {
    pub resolved: &'a Resolved,
    /// Write a plain data-parallel rank count as `dp_replicate` (`config show`); otherwise the
    /// world is left to the next run (a resume may use any world size).
    pub keep_world: bool,
}

/// The resolved configuration as YAML in the configuration file's schema: every row with a
/// key and a value, sections opened as the keys' dotted paths require (the table keeps each
/// section's keys together).
pub fn write_yaml(resolved: &Resolved, keep_world: bool) -> String {
    let view = YamlView {
        resolved,
        keep_world,
    };
    let mut out = String::new();
    let mut open: Vec<&str> = Vec::new();
    for o in EVAL_OPTIONS {
        let (Some(key), Some(value)) = (o.key, o.yaml) else {
            continue;
        };
        let Some(value) = value(&view) else {
            continue;
        };
        let parts: Vec<&str> = key.split('.').collect();
        let (leaf, sections) = parts.split_last().expect("split yields one part at least");
        let shared = open
            .iter()
            .zip(sections)
            .take_while(|(a, b)| a == b)
            .count();
        open.truncate(shared);
        for s in &sections[shared..] {
            out += &format!("{}{s}:\n", "  ".repeat(open.len()));
            open.push(s);
        }
        out += &format!("{}{leaf}: {value}\n", "  ".repeat(open.len()));
    }
    out
}

/// A string as a YAML scalar: plain when YAML reads it back as the same string, else
/// double-quoted (JSON's escapes are YAML's).
pub fn scalar(s: &str) -> String {
    let safe_chars = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c));
    let safe_start = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "/_".contains(c));
    let reads_as_other = matches!(
        s.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n"
    );
    if safe_chars && safe_start && !reads_as_other {
        s.to_string()
    } else {
        serde_json::to_string(s).expect("strings serialize")
    }
}

/// A path as a YAML scalar.
pub fn path_scalar(p: &std::path::Path) -> String {
    scalar(&p.display().to_string())
}
