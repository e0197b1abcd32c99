//! Communication: a small [`Communicator`] abstraction with two backends, and what is built
//! on it alone (collectives, groups, the byte codec, agreement, launcher detection). The
//! parallel execution that uses it (mesh, schedules, data- and model-parallel executors)
//! lives in [`crate::parallel`].
//!
//! - [`local`]: N ranks as threads of one process, sharing one read-only copy of the weights
//!   (`ppl eval --ranks N`, the default backend).
//! - `mpi` (cargo feature `mpi`): one rank per MPI process (`mpirun -np N ppl eval …`).
//! - `nccl` (cargo feature `nccl`): not a [`Communicator`] but a GPU-side all-reduce for the
//!   tensor-parallel activations ([`TpBackend::Nccl`]), set up over one.
//!
//! Backends implement point-to-point messages of bytes; the collectives (barrier, broadcast,
//! gather, all-gather, an exact integer all-reduce) are built once on top of them, in
//! [`Communicator`]'s provided methods. Everything above ([`crate::parallel::schedule`],
//! [`agreement`], the data-parallel run in [`crate::parallel::data_parallel`]) only sees the
//! trait.

pub mod agreement;
pub mod codec;
pub mod group;
pub mod json;
pub mod launcher;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the tensor-parallel activations are summed (`--tp-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TpBackend {
    /// Over the host communicator (local or MPI), in rank order.
    #[default]
    Host,
    /// GPU to GPU with NCCL (cargo feature `nccl`, `--device cuda`; see the `nccl` module).
    Nccl,
}

impl std::fmt::Display for TpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TpBackend::Host => "host",
            TpBackend::Nccl => "nccl",
        })
    }
}

/// Tags keep the protocol's message streams apart.
pub mod tag {
    pub const COLLECTIVE: u32 = 1;
    pub const BROADCAST: u32 = 2;
    pub const TO_ROOT: u32 = 10;
    pub const ASSIGN: u32 = 11;
    /// Direct all-gathers and the two halves of the model-parallel all-reduce.
    pub const GATHER_DIRECT: u32 = 12;
    pub const REDUCE_SCATTER: u32 = 13;
    pub const ALL_GATHER_SUMS: u32 = 14;
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank} ({host}) failed: {reason}")]
    RankFailed {
        rank: usize,
        host: String,
        reason: String,
    },
    #[error("no message from rank {peer} within {seconds} s (rank {rank} waited, PPL_COMM_TIMEOUT); it may have died, hung or lost its network link: check its log, the network and firewall between the nodes, run `ppl validate --distributed`, then re-run")]
    Timeout {
        rank: usize,
        peer: String,
        seconds: u64,
    },
    #[error("communication failure: {0}")]
    Transport(String),
    #[error("malformed message from rank {from}: {detail}")]
    Protocol { from: usize, detail: String },
}

/// Point-to-point messaging between ranks, plus collectives derived from it.
///
/// `send` never waits for the receiver (messages are buffered by the backend), and messages
/// from one rank with one tag arrive in the order they were sent.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Host name of this rank.
    fn host(&self) -> String;
    /// Backend name ("local", "mpi").
    fn backend(&self) -> &'static str;

    fn send(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<(), CommError>;
    fn recv(&self, src: usize, tag: u32) -> Result<Vec<u8>, CommError>;
    /// The next message with `tag` from any rank.
    fn recv_any(&self, tag: u32) -> Result<(usize, Vec<u8>), CommError>;
    /// A pending message with `tag` from any rank, without waiting.
    fn try_recv_any(&self, tag: u32) -> Result<Option<(usize, Vec<u8>)>, CommError>;
    /// Tells the other ranks that this one failed, so nobody waits for it.
    fn abort(&self, reason: &str);

    /// Everyone's bytes at `root` (in rank order); `None` elsewhere.
    fn gather(&self, root: usize, data: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, CommError> {
        if self.rank() != root {
            self.send(root, tag::COLLECTIVE, data)?;
            return Ok(None);
        }
        let mut own = Some(data);
        let mut out = Vec::with_capacity(self.size());
        for r in 0..self.size() {
            out.push(if r == root {
                own.take().unwrap_or_default()
            } else {
                self.recv(r, tag::COLLECTIVE)?
            });
        }
        Ok(Some(out))
    }

    /// `root`'s bytes on every rank.
    fn broadcast(&self, root: usize, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        if self.rank() == root {
            for r in (0..self.size()).filter(|&r| r != root) {
                self.send(r, tag::BROADCAST, data.clone())?;
            }
            Ok(data)
        } else {
            self.recv(root, tag::BROADCAST)
        }
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        let gathered = self.gather(0, data)?;
        let bytes = gathered.map(|all| frame(&all)).unwrap_or_default();
        let all = self.broadcast(0, bytes)?;
        unframe(&all).ok_or_else(|| CommError::Protocol {
            from: 0,
            detail: "malformed all-gather frame".into(),
        })
    }

    /// Everyone's bytes on every rank, each rank sending its part straight to every other
    /// (no root in the middle: `(size − 1) · len` bytes out and in per rank). Relies on sends
    /// that do not wait for the receiver, which both backends provide.
    fn all_gather_direct(&self, tag: u32, data: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        let me = self.rank();
        for r in (0..self.size()).filter(|&r| r != me) {
            self.send(r, tag, data.clone())?;
        }
        let mut own = Some(data);
        (0..self.size())
            .map(|r| {
                if r == me {
                    Ok(own.take().unwrap_or_default())
                } else {
                    self.recv(r, tag)
                }
            })
            .collect()
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.all_gather(Vec::new()).map(|_| ())
    }

    /// Exact element-wise sum of integers over all ranks.
    fn all_reduce_sum_i128(&self, values: &[i128]) -> Result<Vec<i128>, CommError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather(bytes)?;
        let mut sum = vec![0i128; values.len()];
        for (r, b) in all.iter().enumerate() {
            if b.len() != values.len() * 16 {
                return Err(CommError::Protocol {
                    from: r,
                    detail: format!(
                        "all-reduce of {} values got {} bytes",
                        values.len(),
                        b.len()
                    ),
                });
            }
            for (s, chunk) in sum.iter_mut().zip(b.chunks_exact(16)) {
                *s += i128::from_le_bytes(chunk.try_into().expect("16 bytes"));
            }
        }
        Ok(sum)
    }
}

/// Length-prefixed concatenation: count, then each part's length and bytes (little endian).
fn frame(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + parts.iter().map(|p| p.len() + 8).sum::<usize>());
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn unframe(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Option<std::ops::Range<usize>> {
        let end = pos.checked_add(n).filter(|&e| e <= b.len())?;
        let r = pos..end;
        pos = end;
        Some(r)
    };
    let u64_at =
        |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes")) as usize;
    let count = u64_at(take(8)?);
    let mut out = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = u64_at(take(8)?);
        out.push(b[take(len)?].to_vec());
    }
    Some(out)
}

/// What a rank adds to its last words when it aborts the job (e.g. the `--resume` command for
/// the run directory), set once the run directory is known. Process-wide because an abort is
/// the process's last act, reached from deep inside the communication layer.
static ABORT_NOTE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the note every abort of this process prints (the first call wins), and prints it too
/// when the process is terminated from outside (SIGTERM: a launcher ending the job after
/// another host was lost, a batch system's time limit).
pub fn set_abort_note(note: String) {
    if ABORT_NOTE.set(note).is_ok() {
        if let Some(note) = ABORT_NOTE.get() {
            on_sigterm_say(&format!(
                "error: terminated (SIGTERM) before the run finished; {note}\n"
            ));
        }
    }
}

/// The message the SIGTERM handler writes, leaked once: a handler may only read it.
static SIGTERM_MESSAGE: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();

/// Installs a SIGTERM handler that writes `message` to stderr and exits with 143 (128 + 15,
/// what the default action reports).
fn on_sigterm_say(message: &str) {
    let leaked: &'static [u8] = Box::leak(message.as_bytes().to_vec().into_boxed_slice());
    if SIGTERM_MESSAGE.set(leaked).is_err() {
        return;
    }
    extern "C" fn handler(_: libc::c_int) {
        if let Some(m) = SIGTERM_MESSAGE.get() {
            crate::preflight::remove_spool_in_handler();
            // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is 'static.
            unsafe {
                libc::write(2, m.as_ptr().cast(), m.len());
                libc::_exit(143);
            }
        }
    }
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGTERM, handler as *const () as libc::sighandler_t);
    }
}

/// The note set by [`set_abort_note`], if any.
pub fn abort_note() -> Option<&'static str> {
    ABORT_NOTE.get().map(String::as_str)
}

/// How long a rank waits for a message before declaring its peer lost
/// (`PPL_COMM_TIMEOUT` seconds, default 600).
pub fn comm_timeout() -> Duration {
    let secs = std::env::var("PPL_COMM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    Duration::from_secs(secs)
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}
