//! The data-parallel run: every rank scores its share of the windows and streams each
//! finished unit's exact records to rank 0, which also hands out work under the dynamic
//! schedule. Rank 0 ends with every window's record and every rank's statistics; the totals
//! are then summed exactly there, so nothing depends on the world size or on who scored what.
//!
//! The protocol is generic over what a window's scoring produces (a [`Record`]): `ppl eval`'s
//! exact NLL sums ([`WindowResult`]) or `ppl compare`'s per-token comparisons.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::schedule::{self, Schedule};
use crate::comm::json::{decode, encode};
use crate::comm::{tag, CommError, Communicator};
use crate::data::Window;
use crate::eval::ledger::{LedgerError, LedgerWriter};
pub use crate::eval::Record;
use crate::eval::{self, WindowResult};
use crate::model::{Llama, ModelError};

/// What scores a unit of windows on a replica: the whole model on this rank
/// ([`ModelScorer`]), or a model-parallel replica led by this rank
/// ([`super::model_parallel::StageRunner`]).
pub trait Scorer {
    /// What a scored window leaves behind.
    type Output: Record;
    /// Starts the windows `unit` (indices into the run's windows) and returns the exact
    /// records of every window that finished meanwhile: this unit's, or (in a pipeline, which
    /// keeps several units in flight) earlier ones.
    fn score(&mut self, unit: &[usize]) -> Result<Vec<Self::Output>, RunError>;
    /// Called once when this replica has no more work: returns the records still in flight
    /// (a pipeline is then told to stop; an FSDP shard group keeps this replica joining its
    /// gathers until every member is done).
    fn finish(&mut self) -> Result<Vec<Self::Output>, RunError> {
        Ok(Vec::new())
    }
}

/// The whole model on this rank.
pub struct ModelScorer<'a> {
    pub model: &'a Llama,
    pub windows: &'a [Window],
}

impl Scorer for ModelScorer<'_> {
    type Output = WindowResult;
    fn score(&mut self, unit: &[usize]) -> Result<Vec<WindowResult>, RunError> {
        let batch: Vec<Window> = unit.iter().map(|&i| self.windows[i].clone()).collect();
        Ok(eval::score_batch(self.model, &batch)?)
    }
}

/// Per-rank figures, gathered on rank 0 into `results.json` under `ranks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStats {
    pub rank: usize,
    pub host: String,
    pub threads: usize,
    pub windows: usize,
    /// Scored tokens.
    pub tokens: u64,
    /// Tokens through the model.
    pub input_tokens: u64,
    /// Seconds in the forward pass and NLL.
    pub compute_s: f64,
    /// Seconds sending and receiving.
    pub comm_s: f64,
    /// Seconds waiting for work or for other ranks.
    pub idle_s: f64,
    pub wall_s: f64,
    /// Input tokens per second of compute.
    pub tokens_per_s: f64,
    /// Peak RSS of the rank's process (shared by all ranks of the `local` backend).
    pub peak_rss_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
enum ToRoot<R> {
    Results(Vec<R>),
    Request,
    Final(RankStats),
    Failed(String),
}

#[derive(Debug, Serialize, Deserialize)]
enum Assign {
    Work(Vec<usize>),
    Done,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Model(ModelError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A communication failure inside the forward pass becomes [`RunError::Comm`] again, so that
/// a lost rank reads the same whichever layer noticed it.
impl From<ModelError> for RunError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Comm(c) => RunError::Comm(c),
            e => RunError::Model(e),
        }
    }
}

/// What a data-parallel run scores.
pub struct Work<'a, R> {
    pub windows: &'a [Window],
    /// Windows still to score, ascending (all of them unless the run resumes).
    pub todo: Vec<usize>,
    /// Records of the windows already done, from the ledger (rank 0 only).
    pub done: Vec<R>,
    pub batch_size: usize,
    pub schedule: Schedule,
    pub threads: usize,
}

/// What rank 0 holds at the end.
pub struct Gathered<R> {
    /// Every window's record, sorted by index.
    pub results: Vec<R>,
    /// Every rank's statistics, by rank.
    pub ranks: Vec<RankStats>,
}

struct Clock<'l> {
    stats: RankStats,
    start: Instant,
    /// This rank's ledger: every record is appended as soon as it exists.
    ledger: Option<&'l mut LedgerWriter>,
}

impl Clock<'_> {
    fn comm<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.stats.comm_s += t.elapsed().as_secs_f64();
        r
    }
    fn idle<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.stats.idle_s += t.elapsed().as_secs_f64();
        r
    }
    /// Scores a unit (`Some`) or drains the scorer (`None`), stamping the records.
    fn compute<R: Record>(
        &mut self,
        scorer: &mut dyn Scorer<Output = R>,
        unit: Option<&[usize]>,
    ) -> Result<Vec<R>, RunError> {
        let t = Instant::now();
        // Testing aid (PPL_DEBUG_PANIC_RANK=R): rank R crashes in its second unit, as a bug
        // or a failed allocation would.
        if unit.is_some()
            && self.stats.windows > 0
            && std::env::var("PPL_DEBUG_PANIC_RANK")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                == Some(self.stats.rank)
        {
            panic!("PPL_DEBUG_PANIC_RANK: simulated crash");
        }
        let mut r = match unit {
            Some(unit) => scorer.score(unit)?,
            None => scorer.finish()?,
        };
        self.stats.compute_s += t.elapsed().as_secs_f64();
        let finished_s = self.start.elapsed().as_secs_f64();
        for w in &mut r {
            w.stamp(self.stats.rank, finished_s);
        }
        self.stats.windows += r.len();
        self.stats.tokens += r.iter().map(R::scored_tokens).sum::<u64>();
        self.stats.input_tokens += r.iter().map(R::input_tokens).sum::<u64>();
        if let Some(l) = self.ledger.as_deref_mut() {
            l.append(&r)?;
            if unit.is_none() {
                l.sync()?;
            }
        }
        Ok(r)
    }
    fn finish(&mut self) -> RankStats {
        self.stats.wall_s = self.start.elapsed().as_secs_f64();
        self.stats.tokens_per_s = self.stats.input_tokens as f64 / self.stats.compute_s.max(1e-9);
        self.stats.peak_rss_bytes = crate::fingerprint::peak_rss_bytes();
        self.stats.clone()
    }
}

/// Runs this rank's part. Rank 0 returns everything; other ranks return `None`.
/// `on_results` sees every window's record on rank 0 as it arrives (progress display).
pub fn run<R: Record>(
    comm: &dyn Communicator,
    scorer: &mut dyn Scorer<Output = R>,
    work: Work<'_, R>,
    ledger: Option<&mut LedgerWriter>,
    mut on_results: impl FnMut(&[R]) + Send,
) -> Result<Option<Gathered<R>>, RunError> {
    let mut clock = Clock {
        stats: RankStats {
            rank: comm.rank(),
            host: comm.host(),
            threads: work.threads,
            ..Default::default()
        },
        start: Instant::now(),
        ledger,
    };
    let outcome = if comm.rank() == 0 {
        root(comm, scorer, work, &mut clock, &mut on_results)
    } else {
        worker(comm, scorer, &work, &mut clock).map(|_| None)
    };
    match outcome {
        Ok(Some(mut g)) => {
            g.ranks[0] = clock.finish();
            Ok(Some(g))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            // Make sure nobody waits for this rank.
            let reason = e.to_string();
            if comm.rank() != 0 {
                let failed: ToRoot<R> = ToRoot::Failed(reason.clone());
                let _ = comm.send(0, tag::TO_ROOT, encode(&failed));
            }
            comm.abort(&reason);
            Err(e)
        }
    }
}

/// The callback that sees window records as they reach rank 0.
type OnResults<'a, R> = &'a mut (dyn FnMut(&[R]) + Send);

/// What rank 0's server thread and its compute loop share.
struct Shared<'a, R> {
    queue: Mutex<VecDeque<Vec<usize>>>,
    results: Mutex<Vec<R>>,
    on_results: Mutex<OnResults<'a, R>>,
    /// Set when a worker failed: rank 0 stops taking units.
    stop: AtomicBool,
}

impl<R> Shared<'_, R> {
    fn deliver(&self, r: Vec<R>) {
        (self.on_results.lock().unwrap_or_else(|e| e.into_inner()))(&r);
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(r);
    }
}

/// Rank 0's server: answers work requests and collects records and statistics until every
/// other rank has sent its final statistics. Runs beside rank 0's own compute loop, so a
/// request is answered at once even while rank 0 is in a long forward pass.
fn serve<R: Record>(
    comm: &dyn Communicator,
    sched: Schedule,
    shared: &Shared<'_, R>,
) -> Result<(Vec<RankStats>, f64), RunError> {
    let size = comm.size();
    let mut ranks = vec![RankStats::default(); size];
    let mut finals = 0;
    let mut comm_s = 0.0;
    let mut finished = vec![false; size];
    finished[0] = true;
    while finals < size - 1 {
        let (src, bytes) = match comm.recv_any(tag::TO_ROOT) {
            Ok(m) => m,
            // Name the ranks that never finished instead of "any".
            Err(CommError::Timeout { rank, seconds, .. }) => {
                let missing: Vec<String> = (0..size)
                    .filter(|&r| !finished[r])
                    .map(|r| r.to_string())
                    .collect();
                shared.stop.store(true, Ordering::Relaxed);
                return Err(CommError::Timeout {
                    rank,
                    peer: missing.join(", "),
                    seconds,
                }
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        let t = Instant::now();
        match decode::<ToRoot<R>>(src, &bytes)? {
            ToRoot::Results(r) => shared.deliver(r),
            ToRoot::Request => {
                let a = match sched {
                    Schedule::Dynamic => shared
                        .queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop_front()
                        .map_or(Assign::Done, Assign::Work),
                    Schedule::Static => Assign::Done,
                };
                comm.send(src, tag::ASSIGN, encode(&a))?;
            }
            ToRoot::Final(stats) => {
                ranks[src] = stats;
                finished[src] = true;
                finals += 1;
            }
            ToRoot::Failed(reason) => {
                shared.stop.store(true, Ordering::Relaxed);
                return Err(CommError::RankFailed {
                    rank: src,
                    host: "see its log".into(),
                    reason,
                }
                .into());
            }
        }
        comm_s += t.elapsed().as_secs_f64();
    }
    Ok((ranks, comm_s))
}

fn root<R: Record>(
    comm: &dyn Communicator,
    scorer: &mut dyn Scorer<Output = R>,
    work: Work<'_, R>,
    clock: &mut Clock<'_>,
    on_results: OnResults<'_, R>,
) -> Result<Option<Gathered<R>>, RunError> {
    let size = comm.size();
    let (windows, sched) = (work.windows, work.schedule);
    let queue = match sched {
        Schedule::Static => schedule::units(
            windows,
            &schedule::static_share(&work.todo, 0, size),
            work.batch_size,
        ),
        Schedule::Dynamic => schedule::units(windows, &work.todo, work.batch_size),
    };
    // Windows done before a resume count as delivered.
    if !work.done.is_empty() {
        on_results(&work.done);
    }
    let shared = Shared {
        queue: Mutex::new(queue),
        results: Mutex::new(work.done),
        on_results: Mutex::new(on_results),
        stop: AtomicBool::new(false),
    };
    let served = std::thread::scope(|s| -> Result<Vec<RankStats>, RunError> {
        let server = (size > 1).then(|| s.spawn(|| serve(comm, sched, &shared)));
        let own: Result<(), RunError> = (|| {
            while !shared.stop.load(Ordering::Relaxed) {
                let unit = shared
                    .queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop_front();
                let Some(unit) = unit else { break };
                let r = clock.compute(scorer, Some(&unit))?;
                shared.deliver(r);
            }
            let r = clock.compute(scorer, None)?;
            shared.deliver(r);
            Ok(())
        })();
        if let Err(e) = own {
            // Wake the server (and every rank) before leaving.
            comm.abort(&e.to_string());
            if let Some(h) = server {
                let _ = h.join();
            }
            return Err(e);
        }
        match server {
            None => Ok(vec![RankStats::default()]),
            Some(h) => {
                let (ranks, comm_s) = clock.idle(|| h.join()).map_err(|_| {
                    CommError::Transport("rank 0's server thread panicked".into())
                })??;
                clock.stats.comm_s += comm_s;
                Ok(ranks)
            }
        }
    })?;
    let mut results = shared
        .results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(R::index);
    if results.len() != windows.len() || results.iter().enumerate().any(|(i, r)| r.index() != i) {
        return Err(CommError::Protocol {
            from: 0,
            detail: format!(
                "rank 0 holds {} window records for {} windows",
                results.len(),
                windows.len()
            ),
        }
        .into());
    }
    Ok(Some(Gathered {
        results,
        ranks: served,
    }))
}

/// Testing aid (PPL_DEBUG_STALL_RANK=R): rank R goes silent for three communication
/// timeouts, as a hung or unplugged node would, so that the bounded wait and its message can
/// be tested. Returns whether this rank did.
pub(crate) fn stalled_for_testing(rank: usize) -> bool {
    let stall = std::env::var("PPL_DEBUG_STALL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        == Some(rank);
    if stall {
        std::thread::sleep(crate::comm::comm_timeout() * 3);
    }
    stall
}

fn worker<R: Record>(
    comm: &dyn Communicator,
    scorer: &mut dyn Scorer<Output = R>,
    work: &Work<'_, R>,
    clock: &mut Clock<'_>,
) -> Result<(), RunError> {
    let (windows, sched, batch_size) = (work.windows, work.schedule, work.batch_size);
    if stalled_for_testing(comm.rank()) {
        return Ok(());
    }
    match sched {
        Schedule::Static => {
            let mine = schedule::static_share(&work.todo, comm.rank(), comm.size());
            for unit in schedule::units(windows, &mine, batch_size) {
                let r = clock.compute(scorer, Some(&unit))?;
                clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Results(r))))?;
            }
        }
        Schedule::Dynamic => {
            // Two requests in flight: the next unit is usually already here when one ends.
            let mut outstanding = 0;
            for _ in 0..2 {
                clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::<R>::Request)))?;
                outstanding += 1;
            }
            let mut done = false;
            while outstanding > 0 {
                let bytes = clock.idle(|| comm.recv(0, tag::ASSIGN))?;
                outstanding -= 1;
                match decode::<Assign>(0, &bytes)? {
                    Assign::Work(unit) if !done => {
                        let r = clock.compute(scorer, Some(&unit))?;
                        clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Results(r))))?;
                        clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::<R>::Request)))?;
                        outstanding += 1;
                    }
                    Assign::Work(_) => {
                        return Err(CommError::Protocol {
                            from: 0,
                            detail: "work assigned after the end of the queue".into(),
                        }
                        .into())
                    }
                    Assign::Done => done = true,
                }
            }
        }
    }
    let r = clock.compute(scorer, None)?;
    if !r.is_empty() {
        clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Results(r))))?;
    }
    let stats = clock.finish();
    clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::<R>::Final(stats))))?;
    Ok(())
}
