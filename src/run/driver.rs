//! The two drivers: [`evaluate`] runs a world of `--ranks` threads in this process (the `local`
//! backend) with one shared copy of each model part; [`evaluate_rank`] is one rank of any
//! backend (MPI).

use std::sync::Mutex;
use std::time::Instant;

use super::checks::check_before_ranks;
use super::config::{partition, threads_per_rank, EvalConfig, RunOptions};
use super::error::{abort_on_error, EvalError};
use super::local_world::{on_every_rank, RankThreads};
use super::memory_gate::plan_memory;
use super::prepare::setup_rank;
use super::rank::{run_rank, RankInputs};
use crate::comm::{local, Communicator};
use crate::data::WindowPlan;
use crate::model::{Llama, Partition};
use crate::report::progress::{Progress, ProgressMode};
use crate::report::Results;

fn new_progress(opts: &RunOptions, plan: &WindowPlan) -> Mutex<Progress> {
    let input_tokens: usize = plan.windows.iter().map(|w| w.input.len()).sum();
    Mutex::new(Progress::new(
        opts.progress.unwrap_or(ProgressMode::Auto),
        opts.print_chunks,
        plan.windows.len(),
        input_tokens,
    ))
}

/// One rank of any backend, start to finish (used by the MPI launch). Rank 0 returns the
/// results; the others return `None`.
pub fn evaluate_rank(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    opts: &RunOptions,
) -> Result<Option<Results>, EvalError> {
    let data = match &opts.rank_data {
        Some((r, p)) if *r == comm.rank() => p.clone(),
        _ => cfg.data.clone(),
    };
    let setup = abort_on_error(comm, setup_rank(comm, cfg, &data))?;
    let part = abort_on_error(
        comm,
        cfg.dims(comm.size())
            .map(|dims| partition(&dims, comm.rank(), &setup.mc)),
    )?;
    let memory = abort_on_error(
        comm,
        plan_memory(
            cfg,
            &setup,
            1,
            crate::comm::launcher::ranks_on_this_node(),
            std::slice::from_ref(&part),
        ),
    )?;
    let t_load = Instant::now();
    let model = abort_on_error(
        comm,
        cfg.device
            .open(crate::comm::launcher::local_rank())
            .map_err(EvalError::from)
            .and_then(|d| {
                Ok(Llama::load(
                    &setup.gguf,
                    cfg.precision,
                    &part,
                    cfg.quantize,
                    &d,
                )?)
            }),
    )?;
    let load_s = t_load.elapsed().as_secs_f64();
    let progress = (comm.rank() == 0).then(|| new_progress(opts, &setup.prepared.plan));
    let inputs = RankInputs {
        cfg,
        setup: &setup,
        model: &model,
        load_s,
        threads: cfg.threads,
        progress: progress.as_ref(),
        opts,
    };
    let results = run_rank(comm, &inputs)?;
    release_in_background((model, setup));
    Ok(results.map(|r| Results {
        memory: Some(memory),
        ..r
    }))
}

/// Runs `cfg.ranks` ranks as threads of this process (the `local` backend): each rank checks
/// and tokenizes its input, the weights are loaded once and shared read-only, then each rank
/// scores its share on `threads / ranks` threads of its own pool.
pub fn evaluate(cfg: &EvalConfig, opts: &RunOptions) -> Result<Results, EvalError> {
    let n = cfg.ranks.max(1);
    check_before_ranks(cfg, n, opts)?;
    let comms = local::world(n);
    let per_rank = threads_per_rank(cfg.threads, n);
    let data_for = |rank: usize| match &opts.rank_data {
        Some((r, p)) if *r == rank => p.clone(),
        _ => cfg.data.clone(),
    };

    // Phase one on every rank; the first failure (in rank order) is reported.
    let setup_threads = RankThreads {
        pool_threads: None,
        panic_hint: "",
    };
    let setups = on_every_rank(&comms, &setup_threads, |c| {
        setup_rank(c, cfg, &data_for(c.rank()))
    })?;
    let dims = cfg.dims(n)?;
    let mc = &setups[0].mc;
    // Ranks holding the same part of the model share one copy of it.
    let rank_parts: Vec<Partition> = (0..n)
        .map(|r| {
            if dims.splits_model() {
                partition(&dims, r, mc)
            } else {
                Partition::full(mc.n_layers)
            }
        })
        .collect();
    let mut parts: Vec<Partition> = Vec::new();
    for p in &rank_parts {
        if !parts.contains(p) {
            parts.push(p.clone());
        }
    }
    let memory = plan_memory(cfg, &setups[0], n, 1, &parts)?;

    // Each rank's device: the CPU for all, or a GPU each (`cuda`) or one for all (`cuda:N`);
    // a device is opened once, and ranks on one device share a part's copy of the weights.
    let mut devices: Vec<(usize, candle_core::Device)> = Vec::new();
    let mut rank_devices = Vec::with_capacity(n);
    for r in 0..n {
        let ordinal = cfg.device.ordinal(r).unwrap_or(0);
        if !devices.iter().any(|(o, _)| *o == ordinal) {
            devices.push((ordinal, cfg.device.open(r)?));
        }
        rank_devices.push(ordinal);
    }
    let mut loads: Vec<(Partition, usize)> = Vec::new();
    for (p, &d) in rank_parts.iter().zip(&rank_devices) {
        if !loads.contains(&(p.clone(), d)) {
            loads.push((p.clone(), d));
        }
    }
    let t_load = Instant::now();
    let models = loads
        .iter()
        .map(|(p, d)| {
            let device = &devices.iter().find(|(o, _)| o == d).expect("opened").1;
            Llama::load(&setups[0].gguf, cfg.precision, p, cfg.quantize, device)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model_of = |rank: usize| {
        let key = (rank_parts[rank].clone(), rank_devices[rank]);
        let i = loads
            .iter()
            .position(|l| *l == key)
            .expect("every rank's part was loaded");
        &models[i]
    };
    let load_s = t_load.elapsed().as_secs_f64();
    tracing::info!(
        "{} model part(s) loaded for {n} rank(s) in {load_s:.2} s ({} precision, {})",
        loads.len(),
        cfg.precision,
        cfg.device
    );
    let progress = new_progress(opts, &setups[0].prepared.plan);

    let scoring_threads = RankThreads {
        pool_threads: Some(per_rank),
        panic_hint: "; the ledger in the run directory keeps every window finished before it (resume with --resume)",
    };
    let mut outcomes = on_every_rank(&comms, &scoring_threads, |c| {
        let inputs = RankInputs {
            cfg,
            setup: &setups[c.rank()],
            model: model_of(c.rank()),
            load_s,
            threads: per_rank,
            progress: (c.rank() == 0).then_some(&progress),
            opts,
        };
        run_rank(c, &inputs).map(|r| {
            r.map(|r| Results {
                memory: Some(memory.clone()),
                ..r
            })
        })
    })?;
    let results = outcomes
        .swap_remove(0)
        .ok_or_else(|| EvalError::Internal("rank 0 returned no results".into()));
    release_in_background((models, setups));
    results
}

/// Frees `what` (the weights, the GGUF metadata and the tokenizer's tables) on a thread of
/// its own: returning a model's pages and tens of thousands of vocabulary strings takes tens
/// of milliseconds that the results need not wait for (a process that exits right after
/// writing them does not wait at all). Without a thread to spare it is freed here.
fn release_in_background<T: Send + 'static>(what: T) {
    // A failed spawn drops the closure, and `what` with it, right here.
    let _ = std::thread::Builder::new()
        .name("ppl-release".into())
        .spawn(move || drop(what));
}
