//! Bounds checked before anything is allocated or opened: what kind of file an input is,
//! how many local ranks and compute threads this machine can sensibly hold.
//!
//! Each bound exists because its absence was a hang or an out-of-memory kill rather than a
//! message: `--ranks 1000` built 1000 ranks' state (~32 MB each) before anything refused it,
//! `--threads 100000` spawned threads until the kernel stopped it, and a FIFO given as
//! `--model` blocked forever in `open()`.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Local ranks per process allowed per core without `--oversubscribe`.
pub const RANKS_PER_CORE: usize = 4;
/// Local ranks always allowed, whatever the core count (small machines still run the
/// parallel layouts of the tests and examples).
pub const MIN_RANK_LIMIT: usize = 8;
/// Compute threads per core beyond which more threads only cost memory and switches.
pub const THREADS_PER_CORE: usize = 4;

/// This machine's cores (as the scheduler allows this process).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a path is when it is neither a regular file nor a directory ("a FIFO (named pipe)",
/// "a character device", …), found with `stat`, which never blocks. `None` for regular files,
/// directories and paths that cannot be examined (opening them reports why).
pub fn special_file_kind(path: &Path) -> Option<&'static str> {
    let t = std::fs::metadata(path).ok()?.file_type();
    if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// The most local ranks (threads of one process) allowed without `--oversubscribe`.
pub fn local_rank_limit() -> usize {
    (RANKS_PER_CORE * cores()).max(MIN_RANK_LIMIT)
}

/// Refuses more local ranks than [`local_rank_limit`] unless `oversubscribe` says the user
/// means it: every local rank holds its own tokenizer, text and window plan.
pub fn check_local_ranks(ranks: usize, oversubscribe: bool) -> Result<(), String> {
    let limit = local_rank_limit();
    if ranks <= limit || oversubscribe {
        return Ok(());
    }
    Err(format!(
        "{ranks} local ranks on {} core(s) is more than the {limit} this machine can usefully run ({RANKS_PER_CORE} per core; each rank keeps its own tokenizer, text and windows); use fewer ranks (--ranks, or smaller parallel degrees), run them as MPI processes on more nodes, or pass --oversubscribe to run them anyway",
        cores()
    ))
}

/// `threads`, capped at [`THREADS_PER_CORE`] per core with a warning (the thread count never
/// changes a result, only the time and the memory).
pub fn cap_threads(threads: usize) -> usize {
    let cap = THREADS_PER_CORE * cores();
    if threads <= cap {
        return threads;
    }
    tracing::warn!(
        "--threads {threads} is more than {THREADS_PER_CORE} per core on this machine's {} core(s); using {cap} (the result is the same with any thread count)",
        cores()
    );
    cap
}

/// The standard-input spool (`--data -`) to remove if a signal ends the process, as a C
/// string a handler can pass to `unlink` (async-signal-safe).
static SPOOL: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

/// Registers the stdin spool and installs handlers for SIGINT (Ctrl-C), SIGHUP and SIGTERM that
/// remove it and exit with 128 + the signal, as the default action would report. (The
/// SIGTERM handler a run installs later, for its resume hint, removes it too.)
pub fn remove_spool_on_signal(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    if SPOOL.set(c).is_err() {
        return;
    }
    extern "C" fn handler(sig: libc::c_int) {
        remove_spool_in_handler();
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(128 + sig) };
    }
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM] {
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        unsafe {
            libc::signal(sig, handler as *const () as libc::sighandler_t);
        }
    }
}

/// Removes the registered stdin spool; only async-signal-safe calls (for signal handlers).
pub fn remove_spool_in_handler() {
    if let Some(c) = SPOOL.get() {
        // SAFETY: unlink(2) is async-signal-safe and reads a 'static NUL-terminated path.
        unsafe {
            libc::unlink(c.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_named_and_regular_ones_pass() {
        assert_eq!(
            special_file_kind(Path::new("/dev/null")),
            Some("a character device")
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(special_file_kind(dir.path()), None);
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) reads the NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(special_file_kind(&fifo), Some("a FIFO (named pipe)"));
    }

    #[test]
    fn rank_and_thread_bounds() {
        let limit = local_rank_limit();
        assert!(limit >= MIN_RANK_LIMIT);
        assert!(check_local_ranks(limit, false).is_ok());
        let e = check_local_ranks(limit + 1, false).unwrap_err();
        assert!(e.contains("--oversubscribe"), "{e}");
        assert!(check_local_ranks(limit + 1, true).is_ok());
        assert_eq!(cap_threads(1), 1);
        assert_eq!(cap_threads(usize::MAX), THREADS_PER_CORE * cores());
    }
}
