//! # ppl: exact, fast perplexity of large language models
//!
//! The pipeline, one module per stage:
//!
//! ```text
//! data (text, documents) → tokenize (GGUF vocab) → data::windows (chunks | stride | rolling)
//!   → model (GGUF, Llama forward) → eval::nll (f64 log-softmax) → eval::accumulator (exact
//!   fixed-point sums) → eval::stats (± error, bootstrap CI) → report (results.json, summary)
//! ```
//!
//! [`run::evaluate`] runs it end to end from a resolved [`run::EvalConfig`]; the
//! `ppl` binary ([`cli`]) builds that configuration from the command line.
//!
//! Exactness: a window's NLL depends only on the window (per-row kernels, fixed summation
//! order), and totals are kept in integers ([`eval::accumulator`]), so the reported PPL is
//! bit-identical for any batch size, thread count or completion order.

pub mod cli;
pub mod comm;
pub mod compare;
pub mod data;
pub mod eval;
pub mod fingerprint;
pub mod hub;
pub mod model;
pub mod output;
pub mod parallel;
pub mod preflight;
pub mod report;
pub mod run;
pub mod sha256;
pub mod task;
pub mod tokenize;

#[cfg(test)]
mod test_util;
