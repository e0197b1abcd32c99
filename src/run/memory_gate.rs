//! The memory gate: the planner's estimate ([`crate::model::memory`]) for this run against what
//! the machine allows, refusing before loading, with the cheapest remedies.

use super::config::{partition, EvalConfig};
use super::error::EvalError;
use super::prepare::RankSetup;
use crate::model::{memory, Partition, Precision};
use crate::parallel::mesh::ParallelDims;
use crate::report::MemoryReport;

/// Estimates this process's peak memory and refuses, before loading, a run that cannot fit,
/// with the estimate and the cheapest remedies.
pub(crate) fn plan_memory(
    cfg: &EvalConfig,
    setup: &RankSetup,
    ranks_in_process: usize,
    processes_on_node: usize,
    parts: &[Partition],
) -> Result<MemoryReport, EvalError> {
    let est_parts = |precision, batch, ranks, parts: &[Partition]| {
        memory::estimate(
            &setup.gguf,
            &setup.mc,
            precision,
            batch,
            cfg.positions_per_rank(),
            ranks,
            setup.tok.vocab_size,
            parts,
        )
    };
    let est = |precision, batch, ranks| est_parts(precision, batch, ranks, parts);
    let e = est(cfg.precision, cfg.batch_size, ranks_in_process);
    let available = memory::available_bytes();
    let report = MemoryReport {
        estimate: e.clone(),
        available_bytes: available
            .as_ref()
            .map(|a| a.0 / processes_on_node.max(1) as u64),
        available_source: available.as_ref().map(|a| a.1.clone()),
    };
    let Some(budget) = report.available_bytes else {
        return Ok(report);
    };
    if e.total_bytes <= budget {
        return Ok(report);
    }
    let mut remedies = Vec::new();
    let mut consider = |what: &str, alt: memory::MemoryEstimate| {
        if alt.total_bytes < e.total_bytes {
            let fits = if alt.total_bytes <= budget {
                "fits"
            } else {
                "still too much"
            };
            remedies.push(format!(
                "  {what}: {} ({fits})",
                memory::mib(alt.total_bytes)
            ));
        }
    };
    if cfg.batch_size > 1 {
        consider(
            "--batch-size 1 (same result)",
            est(cfg.precision, 1, ranks_in_process),
        );
    }
    if ranks_in_process > 1 {
        consider(
            "--ranks 1, or ranks as MPI processes on more nodes (same result)",
            est(cfg.precision, cfg.batch_size, 1),
        );
    }
    if cfg.precision == Precision::F32 {
        consider(
            "--precision native (quantized weights as stored)",
            est(Precision::Native, cfg.batch_size, ranks_in_process),
        );
    }
    // The model split over two nodes, one process each: the larger share.
    let whole_model = parts
        .iter()
        .all(|p| p.layers.len() == setup.mc.n_layers && p.tp == 1);
    if whole_model && matches!(cfg.precision, Precision::Native | Precision::F32) {
        let split = |dims: ParallelDims| {
            (0..dims.world())
                .map(|r| {
                    let part = partition(&dims, r, &setup.mc);
                    est_parts(
                        cfg.precision,
                        cfg.batch_size,
                        1,
                        std::slice::from_ref(&part),
                    )
                })
                .max_by_key(|e| e.total_bytes)
                .expect("a mesh has ranks")
        };
        let two = |pp, dp_shard| ParallelDims {
            dp_replicate: 1,
            dp_shard,
            tp: 1,
            cp: 1,
            pp,
        };
        consider(
            "--pp 2 over two nodes, one rank each (same result)",
            split(two(2, 1)),
        );
        consider(
            "--dp-shard 2 over two nodes, one rank each (same result)",
            split(two(1, 2)),
        );
    }
    Err(EvalError::Memory(format!(
        "not enough memory: this run needs about {} (weights {}, activations {} and logits {} per rank × {} rank(s), other {}) but {} allows {}{}; nothing was loaded. Cheapest remedies:\n{}",
        memory::mib(e.total_bytes),
        memory::mib(e.weights_bytes),
        memory::mib(e.activations_bytes),
        memory::mib(e.logits_bytes),
        e.ranks_in_process,
        memory::mib(e.other_bytes),
        report.available_source.as_deref().unwrap_or("the system"),
        memory::mib(budget),
        if processes_on_node > 1 {
            format!(" (its share of {processes_on_node} ranks on this node)")
        } else {
            String::new()
        },
        remedies.join("\n")
    )))
}
