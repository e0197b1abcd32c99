//! The two drivers: [`evaluate`] runs a world of `--ranks` threads in this process (the `local`
//! backend) with one shared copy of each model part; [`evaluate_rank`] is one rank of any
//! backend (MPI).

use std::sync::Mutex;
use std::time::Instant;

use super::checks::check_before_ranks;
use super::config::{partition, threads_per_rank, EvalConfig, RunOptions};
use super::error::{first_error, join_rank, panic_message, EvalError};
use super::memory_gate::plan_memory;
use super::prepare::{setup_rank, RankSetup};
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
    let setup = match setup_rank(comm, cfg, &data) {
        Ok(s) => s,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let part = match cfg.dims(comm.size()) {
        Ok(dims) => partition(&dims, comm.rank(), &setup.mc),
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let memory = match plan_memory(
        cfg,
        &setup,
        1,
        crate::comm::launcher::ranks_on_this_node(),
        std::slice::from_ref(&part),
    ) {
        Ok(m) => m,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let t_load = Instant::now();
    let model = match cfg
        .device
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
        }) {
        Ok(m) => m,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
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
    let setups: Vec<Result<RankSetup, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let data = data_for(c.rank());
                s.spawn(move || {
                    let r = setup_rank(c, cfg, &data);
                    if let Err(e) = &r {
                        c.abort(&e.to_string());
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    let setups = first_error(setups)?;
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
    let memory = &memory;

    let outcomes: Vec<Result<Option<Results>, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&setups)
            .map(|(c, setup)| {
                let (model, progress) = (model_of(c.rank()), &progress);
                s.spawn(move || -> Result<Option<Results>, EvalError> {
                    let rank = c.rank();
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(per_rank)
                        .thread_name(move |i| format!("ppl-rank{rank}-{i}"))
                        .build()
                        .map_err(|e| {
                            EvalError::Threads(e.to_string())
                        })?;
                    let progress = (c.rank() == 0).then_some(progress);
                    // A panicking rank tells the others at once (they would otherwise wait
                    // for it until PPL_COMM_TIMEOUT) and is reported by number.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        pool.install(|| {
                            let inputs = RankInputs {
                                cfg,
                                setup,
                                model,
                                load_s,
                                threads: per_rank,
                                progress,
                                opts,
                            };
                            run_rank(c, &inputs).map(|r| {
                                    r.map(|r| Results {
                                        memory: Some(memory.clone()),
                                        ..r
                                    })
                                })
                        })
                    }));
                    outcome.unwrap_or_else(|payload| {
                        let msg = format!(
                            "rank {rank} ({}) panicked: {}",
                            c.host(),
                            panic_message(payload.as_ref())
                        );
                        c.abort(&msg);
                        Err(EvalError::Panic(format!(
                            "{msg}; the ledger in the run directory keeps every window finished before it (resume with --resume)"
                        )))
                    })
                })
            })
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    let mut outcomes = first_error(outcomes)?;
    outcomes
        .swap_remove(0)
        .ok_or_else(|| EvalError::Config("rank 0 returned no results".into()))
}
