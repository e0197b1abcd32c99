//! A local world's ranks as threads of this process, shared by `ppl eval` and `ppl compare`:
//! each rank runs the same closure on its own thread (and, when asked, its own compute pool);
//! a rank that fails or panics aborts the world at once, so no other rank waits for it until
//! the communication timeout, and the most informative error (a rank's own failure before the
//! echoes of it, in rank order) is returned.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::error::{first_error, join_rank, panic_message, EvalError};
use crate::comm::local::LocalComm;
use crate::comm::Communicator;

/// How each rank's thread runs.
pub(crate) struct RankThreads<'a> {
    /// Compute threads of each rank's own pool; `None` runs on the process's global pool
    /// (start-up work that computes little).
    pub pool_threads: Option<usize>,
    /// Appended to the error of a rank that panicked: how to go on (e.g. resume from the
    /// ledger); may be empty.
    pub panic_hint: &'a str,
}

/// Runs `work` on every rank of `comms`, each on its own thread; every rank's value, in rank
/// order, or the first error.
pub(crate) fn on_every_rank<T: Send>(
    comms: &[LocalComm],
    how: &RankThreads<'_>,
    work: impl Fn(&LocalComm) -> Result<T, EvalError> + Sync,
) -> Result<Vec<T>, EvalError> {
    let work = &work;
    let outcomes: Vec<Result<T, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || one_rank(c, how, work)))
            .collect();
        handles.into_iter().map(join_rank).collect()
    });
    first_error(outcomes)
}

fn one_rank<T: Send>(
    c: &LocalComm,
    how: &RankThreads<'_>,
    work: &(impl Fn(&LocalComm) -> Result<T, EvalError> + Sync),
) -> Result<T, EvalError> {
    let rank = c.rank();
    let pool = match how.pool_threads {
        Some(n) => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(move |i| format!("ppl-rank{rank}-{i}"))
                .build()
                .map_err(|e| EvalError::Threads(e.to_string()))?,
        ),
        None => None,
    };
    // A panicking rank tells the others at once (they would otherwise wait for it until
    // PPL_COMM_TIMEOUT) and is reported by number.
    let outcome = catch_unwind(AssertUnwindSafe(|| match &pool {
        Some(pool) => pool.install(|| work(c)),
        None => work(c),
    }));
    let result = outcome.unwrap_or_else(|payload| {
        let msg = format!(
            "rank {rank} ({}) panicked: {}",
            c.host(),
            panic_message(payload.as_ref())
        );
        c.abort(&msg);
        Err(EvalError::Panic(format!("{msg}{}", how.panic_hint)))
    });
    if let Err(e) = &result {
        c.abort(&e.to_string());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;

    const QUIET: RankThreads<'static> = RankThreads {
        pool_threads: Some(1),
        panic_hint: "; hint",
    };

    #[test]
    fn every_rank_runs_on_its_own_pool_and_values_come_in_rank_order() {
        let got = on_every_rank(&local::world(3), &QUIET, |c| {
            Ok((c.rank(), rayon::current_num_threads()))
        })
        .unwrap();
        assert_eq!(got, vec![(0, 1), (1, 1), (2, 1)]);
    }

    #[test]
    fn a_panicking_rank_is_named_and_frees_the_others() {
        let err = on_every_rank(&local::world(2), &QUIET, |c| {
            if c.rank() == 1 {
                panic!("boom");
            }
            // Rank 0 waits for a message rank 1 never sends: the abort ends the wait.
            c.recv(1, crate::comm::tag::COLLECTIVE).map(|_| ())?;
            Ok(())
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("rank 1 (") && msg.contains("panicked: boom"),
            "{msg}"
        );
        assert!(msg.ends_with("; hint"), "{msg}");
    }

    #[test]
    fn a_failing_rank_is_reported_before_the_echoes_of_it() {
        let err = on_every_rank(&local::world(3), &QUIET, |c| {
            if c.rank() == 2 {
                return Err(EvalError::Config("rank two's own reason".into()));
            }
            c.recv(2, crate::comm::tag::COLLECTIVE).map(|_| ())?;
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(&err, EvalError::Rank { rank: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("rank two's own reason"));
    }
}
