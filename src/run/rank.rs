//! Phase two on every rank: score this rank's share through the data-parallel protocol, as a
//! whole model ([`ModelScorer`]) or as part of a model-parallel replica ([`StageRunner`]).
//! Rank 0 ends with every window's record and hands them to [`super::results::assemble`].

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use super::config::{EvalConfig, RunOptions};
use super::error::EvalError;
use super::prepare::RankSetup;
use super::results::{self, Assembly, Environment};
use super::resume::{self, ResumePlan};
use crate::comm::group::{base, Group, Metered};
use crate::comm::{json, Communicator, TpBackend};
use crate::eval::{ledger, WindowResult};
use crate::fingerprint;
use crate::model::{device, DeviceSpec, Llama};
use crate::parallel::data_parallel::{self as dp, ModelScorer};
use crate::parallel::mesh::ParallelDims;
use crate::parallel::model_parallel::StageRunner;
use crate::report::progress::Progress;
use crate::report::{MeshInfo, MeshRank, Results, RunInfo};

/// What one rank brings to phase two.
pub struct RankInputs<'a> {
    pub cfg: &'a EvalConfig,
    pub setup: &'a RankSetup,
    /// This rank's part of the model (shared read-only between local ranks holding the same).
    pub model: &'a Llama,
    /// Seconds the weights took to load, for the timings.
    pub load_s: f64,
    /// Compute threads of this rank.
    pub threads: usize,
    /// Rank 0's progress display.
    pub progress: Option<&'a Mutex<Progress>>,
    pub opts: &'a RunOptions,
}

/// Phase two on every rank: score this rank's share; rank 0 returns the results.
pub fn run_rank(
    comm: &dyn Communicator,
    inputs: &RankInputs<'_>,
) -> Result<Option<Results>, EvalError> {
    let RankInputs {
        cfg, setup, model, ..
    } = *inputs;
    let plan = &setup.prepared.plan;
    let dims = cfg.dims(comm.size())?;
    let model_sha256 =
        fingerprint::sha256_file_cached(&cfg.model).map_err(|source| EvalError::Io {
            action: "read",
            path: cfg.model.clone(),
            purpose: " to fingerprint it",
            source,
            hint: "",
        })?;
    let binding = ledger::Binding {
        model_sha256: model_sha256.clone(),
        data_sha256: setup.text_sha256.clone(),
        tokenizer_sha256: setup.tok.fingerprint.clone(),
        config: cfg.values_json(&dims),
        windows: plan.windows.len(),
        base: None,
    };
    let (resume_plan, done, notes) = resume::agree(comm, cfg, setup, &binding, inputs.opts)?;
    let done_set: HashSet<usize> = resume_plan.done.iter().copied().collect();
    let work = dp::Work {
        windows: &plan.windows,
        todo: (0..plan.windows.len())
            .filter(|i| !done_set.contains(i))
            .collect(),
        done,
        batch_size: cfg.batch_size,
        schedule: cfg.schedule,
        threads: inputs.threads,
    };
    let scoring = Scoring {
        comm,
        inputs,
        dims,
        resume: &resume_plan,
        binding: &binding,
    };
    let t_eval = Instant::now();
    let (gathered, mesh) = if dims.splits_model() {
        scoring.model_parallel(work)?
    } else {
        (scoring.whole_model(work)?, None)
    };
    let eval_s = t_eval.elapsed().as_secs_f64();
    let Some(gathered) = gathered else {
        return Ok(None);
    };
    if let Some(p) = inputs.progress {
        p.lock().unwrap_or_else(|e| e.into_inner()).finish();
    }
    let device = match cfg.device {
        DeviceSpec::Cuda(None) if comm.size() > 1 => "cuda (a GPU per local rank)".into(),
        _ => device::device_name(model.device()),
    };
    Ok(Some(results::assemble(Assembly {
        cfg,
        setup,
        results: gathered.results,
        ranks: gathered.ranks,
        mesh,
        run: RunInfo {
            dir: resume_plan.run_dir.display().to_string(),
            attempt: resume_plan.attempt,
            resumed: cfg.resume,
            windows_from_ledger: resume_plan.done.len(),
            ledger_notes: notes,
        },
        from_ledger: &done_set,
        model_sha256,
        load_s: inputs.load_s,
        eval_s,
        env: Environment {
            host: comm.host(),
            backend: comm.backend().to_string(),
            world_size: comm.size(),
            device,
            peak_rss_bytes: fingerprint::peak_rss_bytes(),
            total_s: setup.started.elapsed().as_secs_f64(),
        },
    })))
}

/// Every window's exact NLL record and every rank's figures, on rank 0.
type Gathered = dp::Gathered<WindowResult>;

/// One rank's scoring, once the ledger and the windows left are known.
struct Scoring<'a> {
    comm: &'a dyn Communicator,
    inputs: &'a RankInputs<'a>,
    dims: ParallelDims,
    resume: &'a ResumePlan,
    binding: &'a ledger::Binding,
}

impl Scoring<'_> {
    /// This rank's ledger, appended to as records arrive (the replica leaders write one).
    fn ledger(&self) -> Result<ledger::LedgerWriter, EvalError> {
        ledger::LedgerWriter::create(
            &self.resume.run_dir,
            self.comm.rank(),
            self.resume.attempt,
            self.binding.clone(),
        )
        .map_err(|e| {
            self.comm.abort(&e.to_string());
            e.into()
        })
    }

    fn on_results(&self) -> impl FnMut(&[WindowResult]) + Send + '_ {
        move |r: &[WindowResult]| {
            if let Some(p) = self.inputs.progress {
                p.lock().unwrap_or_else(|e| e.into_inner()).update(r);
            }
        }
    }

    /// Every rank holds the whole model: plain data parallelism.
    fn whole_model(&self, work: dp::Work<'_, WindowResult>) -> Result<Option<Gathered>, EvalError> {
        let mut scorer = ModelScorer {
            model: self.inputs.model,
            windows: work.windows,
        };
        let mut ledger = self.ledger()?;
        Ok(dp::run(
            self.comm,
            &mut scorer,
            work,
            Some(&mut ledger),
            self.on_results(),
        )?)
    }

    /// A replica spread over ranks (tp, pp, FSDP): its leader takes part in the data-parallel
    /// protocol, the others follow it; rank 0 also gathers every rank's figures.
    fn model_parallel(
        &self,
        work: dp::Work<'_, WindowResult>,
    ) -> Result<(Option<Gathered>, Option<MeshInfo>), EvalError> {
        let (comm, dims, cfg) = (self.comm, self.dims, self.inputs.cfg);
        let model = self.inputs.model;
        // Model-parallel traffic and the data-parallel protocol's are metered apart: the
        // first is timed per step, the second is timed by the protocol itself.
        let metered = Metered::new(comm);
        let dp_metered = Metered::new(comm);
        let mut runner = StageRunner::new(&metered, dims, model, work.windows, cfg.comm_dtype);
        if cfg.tp_backend == TpBackend::Nccl {
            runner = runner
                .with_nccl()
                .inspect_err(|e| comm.abort(&e.to_string()))?;
        }
        let gathered = if runner.is_leader() {
            let replicas = Group::new(&dp_metered, dims.leaders(), base::DATA_PARALLEL);
            let mut ledger = self.ledger()?;
            dp::run(
                &replicas,
                &mut runner,
                work,
                Some(&mut ledger),
                self.on_results(),
            )?
        } else {
            if let Err(e) = runner.follow() {
                comm.abort(&e.to_string());
                return Err(e.into());
            }
            None
        };
        let traffic = metered.traffic();
        let dp_traffic = dp_metered.traffic();
        let part = &model.partition;
        let me = MeshRank {
            rank: comm.rank(),
            host: comm.host(),
            coords: dims.coords(comm.rank()),
            layers: [part.layers.start, part.layers.end],
            embedding: part.embed,
            output: part.head,
            weights_bytes: model.weights_bytes(),
            peak_rss_bytes: fingerprint::peak_rss_bytes(),
            bytes_sent: traffic.bytes_sent + dp_traffic.bytes_sent,
            bytes_received: traffic.bytes_received + dp_traffic.bytes_received,
            comm_s: traffic.seconds,
            compute_s: (runner.figures.busy_s - runner.figures.step_comm_s).max(0.0),
            steps: runner.figures.steps,
            ring_bytes_sent: runner.ring.bytes(),
            ring_s: runner.ring.seconds(),
        };
        let Some(ranks) = json::gather(&metered, 0, &me)? else {
            return Ok((None, None));
        };
        Ok((
            gathered,
            Some(MeshInfo {
                dims,
                comm_dtype: cfg.comm_dtype,
                layout: dims.describe(),
                ranks,
            }),
        ))
    }
}
