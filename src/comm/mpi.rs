//! The `mpi` backend (cargo feature `mpi`): one rank per MPI process, through rsmpi over
//! OpenMPI or MPICH. Start it with `mpirun -np N ppl eval …`, `srun ppl eval …` or
//! `ppl launch`.
//!
//! Receives poll with a non-blocking matched probe, so that a lost peer becomes a timeout
//! error naming it (`PPL_COMM_TIMEOUT`) instead of a hang, and `abort` ends the whole job.
//! Sends are immediate (`MPI_Isend`) on a buffer the communicator owns until MPI is done with
//! it: `send` never waits for the receiver, as the [`Communicator`] contract requires (a
//! direct all-gather where every rank sends before it receives would otherwise deadlock on
//! large messages).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, Destination, Source};

use super::{comm_timeout, hostname, CommError, Communicator};

pub struct MpiComm {
    // Kept alive for the life of the communicator: dropping it finalises MPI.
    _universe: Universe,
    world: SimpleCommunicator,
    /// MPI is initialised with `Threading::Serialized`: one call at a time. The lock also
    /// guards the sends in flight.
    lock: Mutex<Vec<InFlight>>,
    host: String,
    /// Every rank's host, by rank: a timeout names the host it waited for.
    hosts: Vec<String>,
}

/// An immediate send and the buffer it reads, freed once MPI reports it complete.
struct InFlight {
    request: Request<'static, [u8], StaticScope>,
    buffer: *mut [u8],
}

impl InFlight {
    /// Frees the buffer if the send is complete; otherwise gives it back.
    fn test(self) -> Option<Self> {
        match self.request.test() {
            Ok(_) => {
                // SAFETY: `buffer` came from `Box::leak` in `send` and MPI no longer reads it.
                drop(unsafe { Box::from_raw(self.buffer) });
                None
            }
            Err(request) => Some(InFlight {
                request,
                buffer: self.buffer,
            }),
        }
    }
}

/// Tests every send in flight, keeping the incomplete ones (called with the MPI lock held).
fn progress(in_flight: &mut Vec<InFlight>) {
    let all = std::mem::take(in_flight);
    in_flight.extend(all.into_iter().filter_map(InFlight::test));
}

// SAFETY: every MPI call goes through `lock`, which is what the Serialized threading level
// requires; the handles themselves are plain integers/pointers owned by the MPI library.
unsafe impl Send for MpiComm {}
unsafe impl Sync for MpiComm {}

impl MpiComm {
    pub fn init() -> Result<Self, CommError> {
        let (universe, _level) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| {
                CommError::Transport(
                    "MPI could not be initialised (already initialised in this process?)".into(),
                )
            })?;
        let world = universe.world();
        let host = mpi::environment::processor_name().unwrap_or_else(|_| hostname());
        let hosts = all_hosts(&world, &host);
        Ok(Self {
            _universe: universe,
            world,
            lock: Mutex::new(Vec::new()),
            host,
            hosts,
        })
    }

    /// `rank (host)` for messages.
    fn describe(&self, rank: usize) -> String {
        match self.hosts.get(rank) {
            Some(h) => format!("{rank} ({h})"),
            None => rank.to_string(),
        }
    }

    /// The MPI library's version string.
    pub fn library_version() -> String {
        // Open MPI's string carries its C terminator: without it, the text stays text.
        mpi::environment::library_version()
            .map(|v| v.trim_end_matches('\0').to_string())
            .unwrap_or_else(|_| "unknown".into())
    }

    fn poll<T>(&self, peer: &str, mut f: impl FnMut() -> Option<T>) -> Result<T, CommError> {
        let deadline = Instant::now() + comm_timeout();
        let mut spins = 0u32;
        loop {
            if let Some(v) = f() {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank(),
                    peer: peer.to_string(),
                    seconds: comm_timeout().as_secs(),
                });
            }
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn host(&self) -> String {
        self.host.clone()
    }
    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn send(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<(), CommError> {
        if dest >= self.size() {
            return Err(CommError::Transport(format!(
                "send to rank {dest} of {}",
                self.size()
            )));
        }
        let buffer: &'static mut [u8] = Box::leak(data.into_boxed_slice());
        let ptr: *mut [u8] = buffer;
        let mut in_flight = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the buffer lives until `InFlight::test` sees the request complete.
        let request = self
            .world
            .process_at_rank(dest as i32)
            .immediate_send_with_tag(StaticScope, unsafe { &*ptr }, tag as i32);
        in_flight.push(InFlight {
            request,
            buffer: ptr,
        });
        progress(&mut in_flight);
        Ok(())
    }

    fn recv(&self, src: usize, tag: u32) -> Result<Vec<u8>, CommError> {
        self.poll(&self.describe(src), || {
            let mut in_flight = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            progress(&mut in_flight);
            let matched = self
                .world
                .process_at_rank(src as i32)
                .immediate_matched_probe_with_tag(tag as i32)?;
            Some(matched.matched_receive_vec::<u8>().0)
        })
    }

    fn recv_any(&self, tag: u32) -> Result<(usize, Vec<u8>), CommError> {
        self.poll("any", || self.try_probe_any(tag))
    }

    fn try_recv_any(&self, tag: u32) -> Result<Option<(usize, Vec<u8>)>, CommError> {
        Ok(self.try_probe_any(tag))
    }

    fn abort(&self, reason: &str) {
        let note = super::abort_note()
            .map(|n| format!("\n{n}"))
            .unwrap_or_default();
        eprintln!(
            "error: rank {} ({}): {reason}; aborting the MPI job{note}",
            self.rank(),
            self.host
        );
        // MPI_Abort asks the launcher to end the job; with a host unreachable that request may
        // never be answered. This rank ends regardless, so nothing waits forever on it.
        std::thread::spawn(|| {
            std::thread::sleep(ABORT_GRACE);
            // SAFETY: _exit ends the process at once; no Rust state is touched afterwards.
            unsafe { libc::_exit(1) }
        });
        self.world.abort(1);
    }
}

/// How long `abort` lets MPI_Abort end the process before ending it itself.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// Every rank's host name, by rank (one fixed-size all-gather at start-up).
fn all_hosts(world: &SimpleCommunicator, host: &str) -> Vec<String> {
    use mpi::collective::CommunicatorCollectives;
    const NAME: usize = 256;
    let mut mine = [0u8; NAME];
    let bytes = host.as_bytes();
    let n = bytes.len().min(NAME);
    mine[..n].copy_from_slice(&bytes[..n]);
    let mut all = vec![0u8; NAME * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    all.chunks_exact(NAME)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(NAME);
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect()
}

impl MpiComm {
    fn try_probe_any(&self, tag: u32) -> Option<(usize, Vec<u8>)> {
        let mut in_flight = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        progress(&mut in_flight);
        let (msg, status) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(tag as i32)?;
        let src = status.source_rank() as usize;
        Some((src, (msg, status).matched_receive_vec::<u8>().0))
    }
}

impl Drop for MpiComm {
    /// Waits (bounded by `PPL_COMM_TIMEOUT`) for the sends still in flight before MPI is
    /// finalised; a send nobody will ever receive is abandoned, not waited for forever.
    fn drop(&mut self) {
        let deadline = Instant::now() + comm_timeout();
        loop {
            let mut in_flight = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            progress(&mut in_flight);
            if in_flight.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                // Leak them: dropping an incomplete request aborts the process.
                for f in in_flight.drain(..) {
                    std::mem::forget(f.request);
                }
                return;
            }
            drop(in_flight);
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
