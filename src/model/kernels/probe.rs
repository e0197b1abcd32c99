//! Confirms that an advertised instruction set executes: some machines advertise AVX-512 in
//! CPUID that traps (SIGILL) when used, so a child process runs a few of the level's
//! instructions first and only a clean exit counts.

use super::Isa;

/// Whether `level`'s instructions ran in a child process that then exited cleanly. When
/// no verdict could be had (no fork, no exit status), CPUID is trusted for AVX2 (which no
/// machine is known to advertise without executing) but not for AVX-512.
#[cfg(all(target_arch = "x86_64", unix))]
pub(super) fn executes(level: Isa) -> bool {
    // SAFETY (both closures): they run only in the probe's child, where an instruction
    // the CPU cannot execute ends the child with SIGILL, the outcome being tested.
    let child: fn() -> bool = match level {
        Isa::Portable => || true,
        Isa::Avx2 => || unsafe { x86::avx2_works() },
        Isa::Avx512 => || unsafe { x86::avx2_works() && x86::avx512_works() },
        Isa::Avx512Bf16 => {
            || unsafe { x86::avx2_works() && x86::avx512_works() && x86::avx512bf16_works() }
        }
        Isa::Amx => || unsafe {
            x86::avx2_works()
                && x86::avx512_works()
                && x86::avx512bf16_works()
                && x86::request_tile_data()
                && x86::amx_works()
        },
    };
    if level == Isa::Amx && !x86::request_tile_data() {
        tracing::warn!(
            "CPUID advertises AMX but the kernel refused the tile-data permission \
             (arch_prctl ARCH_REQ_XCOMP_PERM: {}); not using it",
            std::io::Error::last_os_error()
        );
        return false;
    }
    match run_child(child, std::time::Duration::from_secs(2)) {
        Verdict::Clean if level == Isa::Amx => {
            let same = crate::model::kernels::rows16::tiles::hardware_matches_definition();
            if !same {
                tracing::warn!(
                    "this CPU's AMX tile unit does not compute the known-answer program \
                     as the instructions' definitions do; not using it"
                );
            }
            same
        }
        Verdict::Clean => true,
        Verdict::Failed => {
            tracing::debug!("the {} probe did not exit cleanly", level.name());
            false
        }
        Verdict::Unknown(why) => {
            let trusted = level <= Isa::Avx2;
            tracing::warn!(
                "could not confirm that {} executes ({why}); {}",
                level.name(),
                if trusted {
                    "trusting CPUID"
                } else {
                    "not using it"
                }
            );
            trusted
        }
    }
}

/// How a probe child ended.
#[cfg(all(target_arch = "x86_64", unix))]
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Returned true and exited with status 0.
    Clean,
    /// Killed by a signal (SIGILL), returned false, or still running at the bound.
    Failed,
    /// No verdict: the fork or the wait failed.
    Unknown(&'static str),
}

/// While alive, SIGCHLD is not ignored: an ignored SIGCHLD (or SA_NOCLDWAIT), which a
/// process can inherit from its parent, has the kernel reap children before their status
/// can be read. Anything else (the default, a handler) is left alone.
#[cfg(all(target_arch = "x86_64", unix))]
struct ReapableChildren(Option<libc::sigaction>);

#[cfg(all(target_arch = "x86_64", unix))]
impl ReapableChildren {
    fn ensure() -> Self {
        // SAFETY: sigaction reads into / from zero-initialised plain-data structs; the
        // default action installs no handler.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) != 0 {
                return ReapableChildren(None);
            }
            let ignored =
                old.sa_sigaction == libc::SIG_IGN || old.sa_flags & libc::SA_NOCLDWAIT != 0;
            if !ignored {
                return ReapableChildren(None);
            }
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            if libc::sigaction(libc::SIGCHLD, &default, std::ptr::null_mut()) != 0 {
                return ReapableChildren(None);
            }
            ReapableChildren(Some(old))
        }
    }
}

#[cfg(all(target_arch = "x86_64", unix))]
impl Drop for ReapableChildren {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: restores the action read in `ensure`.
            unsafe { libc::sigaction(libc::SIGCHLD, old, std::ptr::null_mut()) };
        }
    }
}

/// Runs `child` in a forked process and waits for it at most `bound` (then kills it).
#[cfg(all(target_arch = "x86_64", unix))]
pub(super) fn run_child(child: fn() -> bool, bound: std::time::Duration) -> Verdict {
    use std::time::{Duration, Instant};
    let sigchld = ReapableChildren::ensure();
    // SAFETY: the child only restores SIGILL's default action, runs `child` (register
    // work: no allocation, no locks, so forking a multi-threaded process is sound) and
    // leaves through `_exit`, skipping destructors, atexit handlers and buffered output.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the child, as above.
        unsafe {
            libc::signal(libc::SIGILL, libc::SIG_DFL);
            libc::_exit(if child() { 0 } else { 1 })
        }
    }
    let verdict = if pid < 0 {
        Verdict::Unknown("fork failed")
    } else {
        wait_child(pid, Instant::now() + bound)
    };
    drop(sigchld);
    return verdict;

    fn wait_child(pid: libc::pid_t, deadline: Instant) -> Verdict {
        let mut status = 0;
        loop {
            // SAFETY: `pid` is our child; `status` is a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                let clean = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
                return if clean {
                    Verdict::Clean
                } else {
                    Verdict::Failed
                };
            }
            let errno = std::io::Error::last_os_error().raw_os_error();
            if r < 0 && errno != Some(libc::EINTR) {
                return Verdict::Unknown("waitpid failed");
            }
            if Instant::now() >= deadline {
                // SAFETY: our own child, not yet reaped; the blocking wait reaps it.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return Verdict::Failed;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Whether `tdpbf16ps` ran in a probe child (the tile-data permission is already held:
/// the process uses AMX).
#[cfg(all(target_arch = "x86_64", unix))]
pub(super) fn bf16_tiles_execute() -> bool {
    // SAFETY: runs only in the probe's child, where a CPU without AMX-BF16 ends the
    // child with SIGILL, the outcome being tested.
    let child: fn() -> bool = || unsafe { x86::request_tile_data() && x86::amx_bf16_works() };
    run_child(child, std::time::Duration::from_secs(2)) == Verdict::Clean
}

/// Without `fork`, CPUID is trusted.
#[cfg(not(all(target_arch = "x86_64", unix)))]
pub(super) fn executes(_level: Isa) -> bool {
    true
}

#[cfg(all(target_arch = "x86_64", unix))]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// An FMA, an F16C conversion and an AVX2 integer permute, checked.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn avx2_works() -> bool {
        let x = _mm256_set1_ps(black_box(1.5));
        let f = _mm256_fmadd_ps(x, x, x); // 3.75
        let h = _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(f));
        let i = _mm256_permutevar8x32_epi32(_mm256_cvtps_epi32(h), _mm256_set1_epi32(3));
        black_box(_mm256_extract_epi32::<0>(_mm256_add_epi32(i, i))) == 8
    }

    /// A zmm `vpdpbusd`, byte-wise (BW) and ymm (VL) operations and opmask logic, checked.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn avx512_works() -> bool {
        let u = _mm512_set1_epi8(black_box(3));
        let s = _mm512_abs_epi8(_mm512_set1_epi8(black_box(-2)));
        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s); // 4·3·2 per lane
        let all = _mm512_cmpeq_epi32_mask(dot, _mm512_set1_epi32(24));
        let narrow = _mm256_dpbusd_epi32(
            _mm256_setzero_si256(),
            _mm512_castsi512_si256(u),
            _mm512_castsi512_si256(s),
        );
        let low = _mm256_cmpeq_epi32_mask(narrow, _mm256_set1_epi32(24));
        black_box(_kand_mask16(all, _mm512_int2mask(low as i32 | 0xFF00))) == 0xFFFF
    }

    /// Asks the kernel for permission to use AMX tile data in this process
    /// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): Linux enables the large
    /// tile state only on request, and a tile instruction before it raises SIGILL. The
    /// permission is the process's (every thread's, forked children's too); asking again
    /// is harmless. A raw system call: async-signal-safe, so also usable in the probe
    /// child.
    pub(super) fn request_tile_data() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        #[cfg(target_os = "linux")]
        // SAFETY: a system call with two integer arguments; no memory is passed.
        return unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        };
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// A `tdpbssd` and a `tdpbsud` on stack data, checked (no allocation: this runs in the
    /// probe's child). Row 0 of A is 1, 2, 3, 4, −1, 0, 0, 0; column 0 of B is 1, 1, 1, 1,
    /// −1 (0xFF), 0, 0, 0 ⇒ signed 10 + 1 = 11, unsigned B 10 − 255 = −245.
    ///
    /// # Safety
    /// The tile-data permission must be held; a CPU without AMX raises SIGILL.
    pub(super) unsafe fn amx_works() -> bool {
        use crate::model::kernels::rows16::tiles::{Hardware, TileConfig, Tiles};
        let cfg = TileConfig::new([
            (1, 4),
            (1, 4),
            (0, 0),
            (0, 0),
            (1, 8),
            (0, 0),
            (2, 4),
            (0, 0),
        ]);
        let a: [u8; 8] = [1, 2, 3, 4, 0xFF, 0, 0, 0];
        let b: [u8; 8] = [1, 1, 1, 1, 0xFF, 0, 0, 0];
        let (mut ss, mut su) = ([0u8; 4], [0u8; 4]);
        let mut t = Hardware;
        t.configure(&cfg);
        t.zero(0);
        t.zero(1);
        t.load(4, black_box(a.as_ptr()), 8);
        t.load(6, black_box(b.as_ptr()), 4);
        t.dp_ss(0, 4, 6);
        t.dp_su(1, 4, 6);
        t.store(0, ss.as_mut_ptr(), 4);
        t.store(1, su.as_mut_ptr(), 4);
        t.release();
        i32::from_le_bytes(black_box(ss)) == 11 && i32::from_le_bytes(black_box(su)) == -245
    }

    /// A `tdpbf16ps` on stack data, checked (no allocation: this runs in the probe's
    /// child): the pair (1.0, 1.5) of A times the pair (3.0, 2.0) of B onto 0.5 is 6.5.
    ///
    /// # Safety
    /// The tile-data permission must be held; a CPU without AMX-BF16 raises SIGILL.
    pub(super) unsafe fn amx_bf16_works() -> bool {
        use crate::model::kernels::rows16::tiles::{Hardware, Tiles, ONE_WORD};
        let cfg = ONE_WORD;
        // Per 32-bit word: the even BF16 value in the low half, the odd one in the high.
        let a = 0x3fc0_3f80u32.to_le_bytes(); // 1.0, 1.5
        let b = 0x4000_4040u32.to_le_bytes(); // 3.0, 2.0
        let mut c = 0.5f32.to_le_bytes();
        let mut t = Hardware;
        t.configure(&cfg);
        t.load(0, black_box(c.as_ptr()), 4);
        t.load(4, black_box(a.as_ptr()), 4);
        t.load(6, black_box(b.as_ptr()), 4);
        t.dp_bf16(0, 4, 6);
        t.store(0, c.as_mut_ptr(), 4);
        t.release();
        f32::from_le_bytes(black_box(c)) == 6.5
    }

    /// A zmm `vdpbf16ps`, checked: 1.5·2 + 1.0·3 added to 0.5 in every lane.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn avx512bf16_works() -> bool {
        // Per 32-bit word: the even BF16 value in the low half, the odd one in the high.
        let a = _mm512_set1_epi32(black_box(0x3fc0_3f80)); // odd 1.5, even 1.0
        let b = _mm512_set1_epi32(black_box(0x4000_4040)); // odd 2.0, even 3.0
        let dot = _mm512_dpbf16_ps(
            _mm512_set1_ps(0.5),
            std::mem::transmute::<__m512i, __m512bh>(a),
            std::mem::transmute::<__m512i, __m512bh>(b),
        );
        black_box(_mm512_cmpeq_ps_mask(dot, _mm512_set1_ps(6.5))) == 0xFFFF
    }
}
