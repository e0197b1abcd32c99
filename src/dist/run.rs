//! The data-parallel run: every rank scores its share of the windows and streams each
//! finished unit's exact records to rank 0, which also hands out work under the dynamic
//! schedule. Rank 0 ends with every window's record and every rank's statistics; the totals
//! are then summed exactly there, so nothing depends on the world size or on who scored what.

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::schedule::{self, Schedule};
use super::{tag, CommError, Communicator};
use crate::data::Window;
use crate::eval::{self, WindowResult};
use crate::model::{Llama, ModelError};

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
enum ToRoot {
    Results(Vec<WindowResult>),
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
    Model(#[from] ModelError),
}

/// What rank 0 holds at the end.
pub struct Gathered {
    /// Every window's record, sorted by index.
    pub results: Vec<WindowResult>,
    /// Every rank's statistics, by rank.
    pub ranks: Vec<RankStats>,
}

struct Clock {
    stats: RankStats,
    start: Instant,
}

impl Clock {
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
    fn compute(
        &mut self,
        model: &Llama,
        windows: &[Window],
        unit: &[usize],
    ) -> Result<Vec<WindowResult>, ModelError> {
        let t = Instant::now();
        let batch: Vec<Window> = unit.iter().map(|&i| windows[i].clone()).collect();
        let r = eval::score_batch(model, &batch)?;
        self.stats.compute_s += t.elapsed().as_secs_f64();
        self.stats.windows += r.len();
        self.stats.tokens += r.iter().map(|w| w.acc.count).sum::<u64>();
        self.stats.input_tokens += r.iter().map(|w| w.input_tokens as u64).sum::<u64>();
        Ok(r)
    }
    fn finish(mut self) -> RankStats {
        self.stats.wall_s = self.start.elapsed().as_secs_f64();
        self.stats.tokens_per_s = self.stats.input_tokens as f64 / self.stats.compute_s.max(1e-9);
        self.stats.peak_rss_bytes = crate::fingerprint::peak_rss_bytes();
        self.stats
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("protocol messages serialize")
}

fn decode<T: for<'de> Deserialize<'de>>(from: usize, b: &[u8]) -> Result<T, CommError> {
    serde_json::from_slice(b).map_err(|e| CommError::Protocol {
        from,
        detail: e.to_string(),
    })
}

/// Runs this rank's part. Rank 0 returns everything; other ranks return `None`.
/// `on_results` sees every window's record on rank 0 as it arrives (progress display).
pub fn run(
    comm: &dyn Communicator,
    model: &Llama,
    windows: &[Window],
    batch_size: usize,
    sched: Schedule,
    threads: usize,
    mut on_results: impl FnMut(&[WindowResult]),
) -> Result<Option<Gathered>, RunError> {
    let mut clock = Clock {
        stats: RankStats {
            rank: comm.rank(),
            host: comm.host(),
            threads,
            ..Default::default()
        },
        start: Instant::now(),
    };
    let outcome = if comm.rank() == 0 {
        root(
            comm,
            model,
            windows,
            batch_size,
            sched,
            &mut clock,
            &mut on_results,
        )
    } else {
        worker(comm, model, windows, batch_size, sched, &mut clock).map(|_| None)
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
                let _ = comm.send(0, tag::TO_ROOT, encode(&ToRoot::Failed(reason.clone())));
            }
            comm.abort(&reason);
            Err(e)
        }
    }
}

/// Rank 0's bookkeeping while it scores and serves.
struct RootState {
    queue: VecDeque<Vec<usize>>,
    results: Vec<WindowResult>,
    ranks: Vec<RankStats>,
    finals: usize,
    sched: Schedule,
}

impl RootState {
    fn handle(
        &mut self,
        comm: &dyn Communicator,
        clock: &mut Clock,
        src: usize,
        bytes: Vec<u8>,
        on_results: &mut dyn FnMut(&[WindowResult]),
    ) -> Result<(), RunError> {
        match decode::<ToRoot>(src, &bytes)? {
            ToRoot::Results(r) => {
                on_results(&r);
                self.results.extend(r);
            }
            ToRoot::Request => {
                let a = match self.sched {
                    Schedule::Dynamic => self.queue.pop_front().map_or(Assign::Done, Assign::Work),
                    Schedule::Static => Assign::Done,
                };
                clock.comm(|| comm.send(src, tag::ASSIGN, encode(&a)))?;
            }
            ToRoot::Final(stats) => {
                self.ranks[src] = stats;
                self.finals += 1;
            }
            ToRoot::Failed(reason) => {
                return Err(CommError::RankFailed {
                    rank: src,
                    host: "see its log".into(),
                    reason,
                }
                .into())
            }
        }
        Ok(())
    }
}

fn root(
    comm: &dyn Communicator,
    model: &Llama,
    windows: &[Window],
    batch_size: usize,
    sched: Schedule,
    clock: &mut Clock,
    on_results: &mut dyn FnMut(&[WindowResult]),
) -> Result<Option<Gathered>, RunError> {
    let size = comm.size();
    let queue = match sched {
        Schedule::Static => schedule::units(
            windows,
            &schedule::static_share(windows.len(), 0, size),
            batch_size,
        ),
        Schedule::Dynamic => {
            let all: Vec<usize> = schedule::all(windows.len()).collect();
            schedule::units(windows, &all, batch_size)
        }
    };
    let mut st = RootState {
        queue,
        results: Vec::with_capacity(windows.len()),
        ranks: vec![RankStats::default(); size],
        finals: 0,
        sched,
    };
    loop {
        while let Some((src, bytes)) = clock.comm(|| comm.try_recv_any(tag::TO_ROOT))? {
            st.handle(comm, clock, src, bytes, on_results)?;
        }
        let Some(unit) = st.queue.pop_front() else {
            break;
        };
        let r = clock.compute(model, windows, &unit)?;
        on_results(&r);
        st.results.extend(r);
    }
    while st.finals < size - 1 {
        let (src, bytes) = clock.idle(|| comm.recv_any(tag::TO_ROOT))?;
        st.handle(comm, clock, src, bytes, on_results)?;
    }
    let mut results = st.results;
    results.sort_by_key(|r| r.index);
    if results.len() != windows.len() || results.iter().enumerate().any(|(i, r)| r.index != i) {
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
        ranks: st.ranks,
    }))
}

fn worker(
    comm: &dyn Communicator,
    model: &Llama,
    windows: &[Window],
    batch_size: usize,
    sched: Schedule,
    clock: &mut Clock,
) -> Result<(), RunError> {
    match sched {
        Schedule::Static => {
            let mine = schedule::static_share(windows.len(), comm.rank(), comm.size());
            for unit in schedule::units(windows, &mine, batch_size) {
                let r = clock.compute(model, windows, &unit)?;
                clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Results(r))))?;
            }
        }
        Schedule::Dynamic => {
            // Two requests in flight: the next unit is usually already here when one ends.
            let mut outstanding = 0;
            for _ in 0..2 {
                clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Request)))?;
                outstanding += 1;
            }
            let mut done = false;
            while outstanding > 0 {
                let bytes = clock.idle(|| comm.recv(0, tag::ASSIGN))?;
                outstanding -= 1;
                match decode::<Assign>(0, &bytes)? {
                    Assign::Work(unit) if !done => {
                        let r = clock.compute(model, windows, &unit)?;
                        clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Results(r))))?;
                        clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Request)))?;
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
    let stats = Clock {
        stats: clock.stats.clone(),
        start: clock.start,
    }
    .finish();
    clock.comm(|| comm.send(0, tag::TO_ROOT, encode(&ToRoot::Final(stats))))?;
    Ok(())
}
