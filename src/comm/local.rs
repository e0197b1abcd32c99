//! The `local` backend: ranks are threads of one process. Each rank has an inbox (a queue
//! with a condition variable); `send` appends to the destination's inbox, `recv` takes the
//! first message matching (source, tag), in arrival order. A failing rank marks the world
//! aborted, which wakes every waiting rank with that rank's error instead of a hang.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::{comm_timeout, hostname, CommError, Communicator};

struct Message {
    src: usize,
    tag: u32,
    data: Vec<u8>,
}

#[derive(Default)]
struct Inbox {
    queue: Mutex<VecDeque<Message>>,
    ready: Condvar,
}

struct World {
    inboxes: Vec<Inbox>,
    aborted: Mutex<Option<CommError>>,
    host: String,
}

/// One rank's endpoint.
pub struct LocalComm {
    rank: usize,
    world: Arc<World>,
}

/// Creates the endpoints of an `n`-rank world.
pub fn world(n: usize) -> Vec<LocalComm> {
    let world = Arc::new(World {
        inboxes: (0..n).map(|_| Inbox::default()).collect(),
        aborted: Mutex::new(None),
        host: hostname(),
    });
    (0..n)
        .map(|rank| LocalComm {
            rank,
            world: world.clone(),
        })
        .collect()
}

impl LocalComm {
    fn aborted(&self) -> Option<CommError> {
        self.world
            .aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits for the first message accepted by `matches`.
    fn take(
        &self,
        matches: impl Fn(&Message) -> bool,
        wait: bool,
        peer: &str,
    ) -> Result<Option<Message>, CommError> {
        let inbox = &self.world.inboxes[self.rank];
        let deadline = Instant::now() + comm_timeout();
        let mut q = inbox.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(pos) = q.iter().position(&matches) {
                return Ok(q.remove(pos));
            }
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            if !wait {
                return Ok(None);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    peer: peer.to_string(),
                    seconds: comm_timeout().as_secs(),
                });
            }
            let step = (deadline - now).min(std::time::Duration::from_millis(200));
            q = inbox
                .ready
                .wait_timeout(q, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.world.inboxes.len()
    }
    fn host(&self) -> String {
        self.world.host.clone()
    }
    fn backend(&self) -> &'static str {
        "local"
    }

    fn send(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<(), CommError> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        let inbox = self.world.inboxes.get(dest).ok_or_else(|| {
            CommError::Transport(format!(
                "rank {} sent to rank {dest}, which does not exist",
                self.rank
            ))
        })?;
        inbox
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Message {
                src: self.rank,
                tag,
                data,
            });
        inbox.ready.notify_all();
        Ok(())
    }

    fn recv(&self, src: usize, tag: u32) -> Result<Vec<u8>, CommError> {
        let m = self.take(|m| m.src == src && m.tag == tag, true, &src.to_string())?;
        Ok(m.expect("blocking take returns a message").data)
    }

    fn recv_any(&self, tag: u32) -> Result<(usize, Vec<u8>), CommError> {
        let m = self.take(|m| m.tag == tag, true, "any")?;
        let m = m.expect("blocking take returns a message");
        Ok((m.src, m.data))
    }

    fn try_recv_any(&self, tag: u32) -> Result<Option<(usize, Vec<u8>)>, CommError> {
        Ok(self
            .take(|m| m.tag == tag, false, "any")?
            .map(|m| (m.src, m.data)))
    }

    fn abort(&self, reason: &str) {
        let mut a = self.world.aborted.lock().unwrap_or_else(|e| e.into_inner());
        if a.is_none() {
            *a = Some(CommError::RankFailed {
                rank: self.rank,
                host: self.world.host.clone(),
                reason: reason.to_string(),
            });
        }
        drop(a);
        for inbox in &self.world.inboxes {
            let _guard = inbox.queue.lock().unwrap_or_else(|e| e.into_inner());
            inbox.ready.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send + 'static>(
        n: usize,
        f: impl Fn(LocalComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = world(n)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                std::thread::spawn(move || f(c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn collectives_on_threads() {
        for n in 1..=4 {
            let out = run(n, |c| {
                let r = c.rank();
                let all = c.all_gather(vec![r as u8; r + 1]).unwrap();
                let b = c
                    .broadcast(0, if r == 0 { b"seed".to_vec() } else { vec![] })
                    .unwrap();
                let sum = c.all_reduce_sum_i128(&[r as i128, i128::MAX / 8]).unwrap();
                c.barrier().unwrap();
                (all, b, sum)
            });
            for (all, b, sum) in out {
                assert_eq!(all.len(), n);
                for (r, v) in all.iter().enumerate() {
                    assert_eq!(v, &vec![r as u8; r + 1]);
                }
                assert_eq!(b, b"seed");
                assert_eq!(sum[0], (0..n as i128).sum::<i128>());
                assert_eq!(sum[1], (i128::MAX / 8) * n as i128);
            }
        }
    }

    #[test]
    fn messages_match_source_and_tag_in_order() {
        let out = run(2, |c| {
            if c.rank() == 1 {
                c.send(0, 7, b"a".to_vec()).unwrap();
                c.send(0, 8, b"x".to_vec()).unwrap();
                c.send(0, 7, b"b".to_vec()).unwrap();
                vec![]
            } else {
                vec![
                    c.recv(1, 8).unwrap(),
                    c.recv(1, 7).unwrap(),
                    c.recv_any(7).unwrap().1,
                ]
            }
        });
        assert_eq!(out[0], vec![b"x".to_vec(), b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn an_aborting_rank_wakes_the_waiting_ones() {
        let out = run(3, |c| {
            if c.rank() == 2 {
                c.abort("out of memory");
                Ok(Vec::new())
            } else {
                c.recv(2, 1)
            }
        });
        for r in &out[..2] {
            let msg = r.as_ref().unwrap_err().to_string();
            assert!(
                msg.contains("rank 2") && msg.contains("out of memory"),
                "{msg}"
            );
        }
    }
}
