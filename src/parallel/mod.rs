//! Parallel execution over a [`crate::comm::Communicator`]: how the ranks are arranged and
//! what each one does.
//!
//! - [`mesh`]: the parallel dimensions (dp_replicate × dp_shard × pp × cp × tp), their rules and
//!   each rank's coordinates.
//! - [`schedule`]: which rank scores which windows (static or dynamic).
//! - [`data_parallel`]: the data-parallel protocol: units handed out, exact records streamed to
//!   rank 0, per-rank statistics.
//! - [`model_parallel`]: a model replica spread over pipeline stages and tensor-parallel ranks
//!   (with FSDP pieces), scoring the units the data-parallel protocol gives it.
//! - [`context_parallel`]: windows split across cp ranks, ring attention, records added up.

pub mod context_parallel;
pub mod data_parallel;
pub mod mesh;
pub mod model_parallel;
pub mod schedule;
