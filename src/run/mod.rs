//! The execution layer: one evaluation, end to end, on every rank: read the model header and tokenizer,
//! read the text, agree with the other ranks on what is being evaluated, tokenize and cut
//! windows, load the weights, score this rank's share (rank 0 gathers every window's exact
//! record) and assemble [`Results`] on rank 0.
//!
//! Cheap checks (configuration, model metadata, data, cross-rank agreement) all run before the
//! weights are loaded, so a bad input fails in well under a second, never after minutes of
//! compute.
//!
//! [`evaluate`] runs a world of `--ranks` threads in this process (the `local` backend) with
//! one shared copy of the weights; [`evaluate_rank`] is one rank of any backend (MPI).
//!
//! - [`config`]: the resolved configuration and each rank's part;
//! - [`checks`]: everything refused before loading; [`memory_gate`]: the memory refusal;
//! - [`prepare`]: phase one (fingerprints, agreement, tokenization) → [`RankSetup`];
//! - [`resume`]: the run directory and its ledgers;
//! - [`rank`]: phase two, scoring, on any mesh; [`results`]: assembling [`Results`];
//! - [`driver`]: the local (threads) and per-rank (MPI) drivers; [`local_world`]: a local
//!   world's ranks as threads (shared with `ppl compare`).

pub mod checks;
pub mod config;
pub mod driver;
pub mod error;
pub(crate) mod local_world;
pub mod memory_gate;
pub mod prepare;
pub mod rank;
pub mod results;
pub mod resume;

pub use checks::{check_mesh, check_plan};
pub use config::{head_cost_in_layers, partition, threads_per_rank, EvalConfig, RunOptions};
pub use driver::{evaluate, evaluate_rank};
pub(crate) use error::abort_on_error;
pub use error::EvalError;
pub(crate) use local_world::{on_every_rank, RankThreads};
pub(crate) use prepare::prepare;
pub use prepare::{fingerprints, setup_rank, RankSetup};
pub use rank::{run_rank, RankInputs};
