//! Sub-communicators and traffic metering.
//!
//! A [`Group`] is a subset of a world's ranks seen as a world of its own (a TP group, an FSDP
//! shard group, the replica leaders that run the data-parallel protocol): its ranks are
//! renumbered `0..len` and its messages carry tags offset by the group kind's base, so
//! collectives of different groups never mix even when they share ranks. Every collective
//! of [`Communicator`] works on it unchanged.
//!
//! [`Metered`] wraps a rank's endpoint and counts the bytes and the seconds of every send and
//! receive through it (the per-rank figures in `results.json`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{CommError, Communicator};

/// Tag bases of the group kinds (each far above the protocol tags of [`super::tag`]).
pub mod base {
    pub const DATA_PARALLEL: u32 = 1000;
    pub const TENSOR_PARALLEL: u32 = 2000;
    pub const SHARD: u32 = 3000;
    pub const CONTEXT_PARALLEL: u32 = 4000;
    /// A replica's first pipeline stage (every cp and TP rank), told each step by the leader.
    pub const STEP: u32 = 5000;
}

pub struct Group<'a> {
    parent: &'a dyn Communicator,
    members: Vec<usize>,
    rank: usize,
    tag_base: u32,
}

impl<'a> Group<'a> {
    /// The group of `members` (world ranks, in group order); the caller must be one of them.
    pub fn new(parent: &'a dyn Communicator, members: Vec<usize>, tag_base: u32) -> Self {
        let rank = members
            .iter()
            .position(|&m| m == parent.rank())
            .expect("a rank belongs to the groups it builds");
        Self {
            parent,
            members,
            rank,
            tag_base,
        }
    }

    fn member(&self, r: usize) -> Result<usize, CommError> {
        self.members.get(r).copied().ok_or_else(|| {
            CommError::Transport(format!(
                "rank {r} is outside a group of {}",
                self.members.len()
            ))
        })
    }

    fn local(&self, world_rank: usize) -> Result<usize, CommError> {
        self.members
            .iter()
            .position(|&m| m == world_rank)
            .ok_or_else(|| CommError::Protocol {
                from: world_rank,
                detail: "a message from outside the group".into(),
            })
    }
}

impl Communicator for Group<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn host(&self) -> String {
        self.parent.host()
    }
    fn backend(&self) -> &'static str {
        self.parent.backend()
    }
    fn send(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<(), CommError> {
        self.parent
            .send(self.member(dest)?, self.tag_base + tag, data)
    }
    fn recv(&self, src: usize, tag: u32) -> Result<Vec<u8>, CommError> {
        self.parent.recv(self.member(src)?, self.tag_base + tag)
    }
    fn recv_any(&self, tag: u32) -> Result<(usize, Vec<u8>), CommError> {
        let (src, data) = self.parent.recv_any(self.tag_base + tag)?;
        Ok((self.local(src)?, data))
    }
    fn try_recv_any(&self, tag: u32) -> Result<Option<(usize, Vec<u8>)>, CommError> {
        match self.parent.try_recv_any(self.tag_base + tag)? {
            Some((src, data)) => Ok(Some((self.local(src)?, data))),
            None => Ok(None),
        }
    }
    fn abort(&self, reason: &str) {
        self.parent.abort(reason)
    }
}

/// Counts traffic through a rank's endpoint.
pub struct Metered<'a> {
    inner: &'a dyn Communicator,
    sent: AtomicU64,
    received: AtomicU64,
    nanos: AtomicU64,
}

/// Traffic of one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Seconds inside send and receive calls (waiting included).
    pub seconds: f64,
}

impl<'a> Metered<'a> {
    pub fn new(inner: &'a dyn Communicator) -> Self {
        Self {
            inner,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }

    pub fn traffic(&self) -> Traffic {
        Traffic {
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

impl Communicator for Metered<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn host(&self) -> String {
        self.inner.host()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn send(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<(), CommError> {
        self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.timed(|| self.inner.send(dest, tag, data))
    }
    fn recv(&self, src: usize, tag: u32) -> Result<Vec<u8>, CommError> {
        let d = self.timed(|| self.inner.recv(src, tag))?;
        self.received.fetch_add(d.len() as u64, Ordering::Relaxed);
        Ok(d)
    }
    fn recv_any(&self, tag: u32) -> Result<(usize, Vec<u8>), CommError> {
        let (s, d) = self.timed(|| self.inner.recv_any(tag))?;
        self.received.fetch_add(d.len() as u64, Ordering::Relaxed);
        Ok((s, d))
    }
    fn try_recv_any(&self, tag: u32) -> Result<Option<(usize, Vec<u8>)>, CommError> {
        let r = self.inner.try_recv_any(tag)?;
        if let Some((_, d)) = &r {
            self.received.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        Ok(r)
    }
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;

    #[test]
    fn groups_renumber_ranks_and_keep_their_traffic_apart() {
        let world = local::world(4);
        std::thread::scope(|s| {
            for c in &world {
                s.spawn(move || {
                    let r = c.rank();
                    // Two overlapping kinds of groups: {0,1},{2,3} and {0,2},{1,3}.
                    let a = Group::new(c, vec![r / 2 * 2, r / 2 * 2 + 1], base::TENSOR_PARALLEL);
                    let b = Group::new(c, vec![r % 2, r % 2 + 2], base::SHARD);
                    let ga = a.all_gather(vec![r as u8]).unwrap();
                    let gb = b.all_gather(vec![10 + r as u8]).unwrap();
                    assert_eq!(
                        ga,
                        vec![vec![(r / 2 * 2) as u8], vec![(r / 2 * 2 + 1) as u8]]
                    );
                    assert_eq!(gb, vec![vec![10 + (r % 2) as u8], vec![12 + (r % 2) as u8]]);
                });
            }
        });
    }

    #[test]
    fn metering_counts_bytes_both_ways() {
        let world = local::world(2);
        let m0 = Metered::new(&world[0]);
        let m1 = Metered::new(&world[1]);
        m0.send(1, 5, vec![0; 100]).unwrap();
        assert_eq!(m1.recv(0, 5).unwrap().len(), 100);
        assert_eq!(m0.traffic().bytes_sent, 100);
        assert_eq!(m1.traffic().bytes_received, 100);
    }
}
