//! What `ppl compare --output` writes ([`CompareResults`]): both sides with their
//! fingerprints, llama.cpp's KL-divergence summary, per-window rows, the base file used, and
//! per-rank figures. Rendered as text by [`super::comparison_text`].
//!
//! Every figure but `seconds`, `config`, `ranks`, `rank_stats`, `run`, `base` and `base_file`
//! is bit-identical whatever the world size, schedule or batch size, and after a resume.

use serde::{Deserialize, Serialize};

use crate::eval::kld::Summary;
use crate::model::{Precision, Quantize};
use crate::parallel::data_parallel::RankStats;
use crate::report::RunInfo;

/// One side of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub path: String,
    pub sha256: String,
    pub precision: Precision,
    pub quantize: Option<Quantize>,
}

/// One window's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowComparison {
    pub index: usize,
    pub tokens: usize,
    pub ppl_base: f64,
    pub ppl_model: f64,
    pub kld_mean: f64,
    /// Percent of the window's tokens with the same top token.
    pub same_top: f64,
}

/// The base file this comparison wrote (`--save-base`) or read (`--base-logits`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseFileUse {
    pub path: String,
    /// `saved` (written by this run) or `read` (the base's logits recomputed from it, bit
    /// for bit).
    pub mode: String,
    pub bytes: u64,
    pub bytes_per_token: f64,
}

/// What `ppl compare --output` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareResults {
    pub ppl_version: String,
    pub base: Side,
    pub model: Side,
    #[serde(flatten)]
    pub summary: Summary,
    pub config: serde_json::Value,
    pub windows: Vec<WindowComparison>,
    /// Ranks that shared the windows (the result does not depend on it).
    pub ranks: usize,
    /// Per-rank figures (windows, tokens, compute/communication/idle seconds), by rank.
    #[serde(default)]
    pub rank_stats: Vec<RankStats>,
    /// The run directory and its ledger (`--resume`); absent in comparisons written before
    /// comparisons kept a ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunInfo>,
    pub base_file: Option<BaseFileUse>,
    pub seconds: f64,
}
