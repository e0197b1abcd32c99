//! Our own CPU kernels, only where a profile showed candle (or our previous kernel) to be the
//! bottleneck. Each has an AVX2 path chosen at run time (the quantized ones also an AVX-512
//! VNNI path) and a portable one that performs the same IEEE operations in the same order, so
//! results are bit-identical at every instruction-set level, for any thread count, batch size
//! or grouping of rows.
//!
//! The level ([`isa`]) is what CPUID advertises, confirmed by executing the instructions in a
//! child process (some machines advertise AVX-512 that traps), capped by `PPL_ISA`.
//!
//! - [`rows16`] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 × Q8_0/Q8_1; Q4_K, Q5_K, Q6_K × Q8_K): one driver generic
//!   over the block format; the weights repacked at load into interleaved groups of sixteen
//!   rows, one 32-bit lane (or tile column) per output, on [`panel`]'s panels of eight
//!   activation rows (quantized as llama.cpp's CPU backend does, blocked for L2); the AMX level
//!   multiplies on the tile unit ([`rows16::tiles`]). candle's Q4_1 and Q5_0 products are
//!   scalar on x86 (SmolLM2 Q4_1: 18 tokens/s; Gemma 3 Q4_K_M, mostly Q5_0: 12.7), its Q8_0
//!   one per row.
//! - [`half`]: F16 weights (BF16 too, though [`own_matrix`] gives BF16 to [`bf16`]) kept
//!   16-bit (candle widened them to f32 at load: twice the memory, and its f32 gemm),
//!   multiplied by activations rounded to the weights' type as llama.cpp's `vec_dot_type`
//!   does, in register tiles of eight activation rows.
//! - [`bf16`]: BF16 weights kept 16-bit, multiplied in the order of AVX-512 BF16's
//!   `vdpbf16ps` (two products per lane per instruction where the CPU has it; the other
//!   levels perform the same FMAs). F16 stays with [`half`].
//! - [`f32_weights`]: F32 weights in `native` precision, used in place from the file's map, in
//!   register tiles of eight activation rows (candle's f32 gemm, which copied them, ran the
//!   SmolLM2 F32 export at 0.84× llama.cpp's speed).
//! - [`half_driver`]: the threading and cache blocking shared by [`half`], [`bf16`] and
//!   [`f32_weights`].
//! - [`kquant`]: the K-quant formats' definitions (super-blocks as the file lays them out,
//!   ggml's dequantization) and the Q8_K activations their [`rows16`] kernels multiply.
//! - [`attention`]: causal f32 attention computing only the visible keys, fused from scores to
//!   values (candle's ops materialised four `[heads, t, t]` tensors per layer).
//! - [`math`]: a vectorised exponential and SiLU gating (glibc's scalar `expf` was 5–7%).
//! - [`exp64`]: the log-softmax's f64 exponentials as glibc's `exp` computes them, in
//!   AVX-512 and AVX2 lanes (the libm call and its loop were about a tenth of a Gemma 3
//!   profile).
//! - [`gelu`]: Gemma's GELU·up with glibc's `tanhf` reproduced bit for bit in AVX-512 lanes
//!   (the scalar libm call was 12% of a Gemma 3 profile).

/// [`OwnMatrix`] for a matrix type whose inherent `shape`, `storage_bytes`, `matmul` and
/// `dequantize_row` are the trait's (the float weight kernels: they share no other input).
macro_rules! own_matrix_from_inherent {
    ($matrix:ty) => {
        impl $crate::model::kernels::OwnMatrix for $matrix {
            fn shape(&self) -> (usize, usize) {
                self.shape()
            }

            fn storage_bytes(&self) -> usize {
                self.storage_bytes()
            }

            fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
                self.matmul(x, m)
            }

            fn dequantize_row(&self, j: usize, out: &mut [f32]) {
                self.dequantize_row(j, out)
            }
        }
    };
}
pub(crate) use own_matrix_from_inherent;

pub mod attention;
pub mod bf16;
pub mod exp64;
pub mod f32_weights;
pub mod gelu;
pub mod half;
pub mod half_driver;
pub mod kquant;
pub mod math;
pub mod panel;
pub mod rows16;
mod shared_input;

pub use shared_input::SharedInput;

use std::sync::Arc;

use candle_core::quantized::GgmlDType;

/// A weight matrix `[n, k]` (n outputs, k inputs) held for one of our kernels.
pub trait OwnMatrix: Send + Sync {
    /// `(n, k)`.
    fn shape(&self) -> (usize, usize);
    /// Bytes held.
    fn storage_bytes(&self) -> usize;
    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32>;
    /// [`OwnMatrix::matmul`] of an input other matrices multiply too, its quantized
    /// activations shared with them (the same bits).
    fn matmul_shared(&self, input: &SharedInput<'_>) -> Vec<f32> {
        self.matmul(input.x(), input.rows())
    }
    /// Row `j` as f32: the same numbers as ggml's (and candle's) dequantization, so a tied
    /// embedding table is looked up from the output layer's copy, one row at a time.
    fn dequantize_row(&self, j: usize, out: &mut [f32]);
}

/// The one place that picks our kernel for a stored matrix `[n, k]` of GGUF type `dtype`:
/// `None` when candle's serves that type, `Some(Err(detail))` when the bytes do not have the
/// type's layout.
pub fn own_matrix(
    dtype: GgmlDType,
    bytes: &[u8],
    n: usize,
    k: usize,
) -> Option<Result<Arc<dyn OwnMatrix>, String>> {
    fn boxed<M: OwnMatrix + 'static>(m: Option<M>) -> Option<Arc<dyn OwnMatrix>> {
        m.map(|m| Arc::new(m) as Arc<dyn OwnMatrix>)
    }
    let m = match dtype {
        // ggml writes K-quants only for rows that are a multiple of 256; other shapes stay with
        // candle, whose verdict on them stands.
        GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K
            if k == 0 || !k.is_multiple_of(kquant::QK_K) =>
        {
            return None
        }
        GgmlDType::Q4K => boxed(rows16::q4k::Q4KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5K => boxed(rows16::q4k::Q5KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q6K => boxed(rows16::q6k::Q6KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q4_1 => boxed(rows16::q4::Q4_1Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5_0 => boxed(rows16::q8_0::Q5_0Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5_1 => boxed(rows16::q8_0::Q5_1Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q8_0 => boxed(rows16::q8_0::Q8_0Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q4_0 => boxed(rows16::q4::Q4_0Rows16::from_bytes(bytes, n, k)),
        GgmlDType::F16 => boxed(self::half::HalfMatrix::from_bytes(
            self::half::HalfType::F16,
            bytes,
            n,
            k,
        )),
        GgmlDType::BF16 => boxed(bf16::Bf16Matrix::from_bytes(bytes, n, k)),
        GgmlDType::F32 => boxed(f32_weights::F32Matrix::from_bytes(bytes, n, k)),
        _ => return None,
    };
    Some(m.ok_or_else(|| format!("a malformed {dtype:?} layout for [{n}, {k}]")))
}

/// The F32 kernel on `[n, k]` f32 values (a matrix dequantized for `--precision f32`); `None`
/// when the count is not `n·k`.
pub fn own_f32_matrix(values: Vec<f32>, n: usize, k: usize) -> Option<Arc<dyn OwnMatrix>> {
    f32_weights::F32Matrix::from_values(values, n, k).map(|m| Arc::new(m) as Arc<dyn OwnMatrix>)
}

/// [`own_matrix`] for a whole tensor still in the file's map: a kernel that can multiply the
/// stored bytes as they are (BF16, F32) keeps them there instead of copying them; every other
/// type is [`own_matrix`] of the bytes.
pub fn own_matrix_in_place(
    dtype: GgmlDType,
    mapped: &crate::model::mapped::MappedBytes,
    n: usize,
    k: usize,
) -> Option<Result<Arc<dyn OwnMatrix>, String>> {
    match dtype {
        GgmlDType::BF16 => Some(
            bf16::Bf16Matrix::from_mapped(mapped, n, k)
                .map(|m| Arc::new(m) as Arc<dyn OwnMatrix>)
                .ok_or_else(|| format!("a malformed {dtype:?} layout for [{n}, {k}]")),
        ),
        GgmlDType::F32 => Some(
            f32_weights::F32Matrix::from_mapped(mapped, n, k)
                .map(|m| Arc::new(m) as Arc<dyn OwnMatrix>)
                .ok_or_else(|| format!("a malformed {dtype:?} layout for [{n}, {k}]")),
        ),
        _ => own_matrix(dtype, mapped.bytes(), n, k),
    }
}

/// The instruction sets our kernels can use, in increasing order. Every kernel gives the same
/// bits at every level (an MPI job may mix machines and must still give one answer); the level
/// only changes the speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: the definition every SIMD path is tested against.
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI (on top of AVX2).
    Avx512,
    /// AVX-512 BF16 on top of [`Isa::Avx512`]: only the BF16 kernel uses it (`vdpbf16ps`);
    /// every other kernel runs its AVX-512 path.
    Avx512Bf16,
    /// AMX tiles (AMX-TILE and AMX-INT8, Sapphire Rapids and later) on top of
    /// [`Isa::Avx512Bf16`]: the interleaved-rows kernels ([`rows16`]) multiply on the tile
    /// unit (`tdpbssd`/`tdpbsud`), and the BF16 kernel too (`tdpbf16ps`) where AMX-BF16
    /// passes its start-up check ([`bf16_tiles`]); every other kernel runs its AVX-512 path.
    Amx,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Amx => "amx",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "none" | "scalar" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx512vnni" | "avx512_vnni" => Some(Isa::Avx512),
            "avx512bf16" | "avx512_bf16" => Some(Isa::Avx512Bf16),
            "amx" | "amx_int8" | "amx-int8" => Some(Isa::Amx),
            _ => None,
        }
    }
}

/// Whether CPUID advertises AVX2 with FMA and F16C, and on top of it AVX-512 F/BW/VL: the
/// base of every kernel family's level (the integer kernels add VNNI, BF16 adds its own).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_and_avx512() -> (bool, bool) {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    (avx2, avx512)
}

/// What this CPU advertises (CPUID), before any cap.
#[cfg(target_arch = "x86_64")]
fn advertised() -> Isa {
    let (avx2, avx512) = avx2_and_avx512();
    let avx512 = avx512 && is_x86_feature_detected!("avx512vnni");
    let bf16 = avx512 && is_x86_feature_detected!("avx512bf16");
    if bf16 && amx_advertised() {
        return Isa::Amx;
    }
    match (avx2, avx512, bf16) {
        (_, _, true) => Isa::Avx512Bf16,
        (_, true, false) => Isa::Avx512,
        (true, false, _) => Isa::Avx2,
        _ => Isa::Portable,
    }
}

/// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25). Read directly: the standard
/// library's detection of AMX features is not stable.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_advertised() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 is read only where the maximum leaf (leaf 0's EAX) reaches it.
    if __cpuid_count(0, 0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn advertised() -> Isa {
    Isa::Portable
}

impl Isa {
    /// The next level down.
    fn below(self) -> Isa {
        match self {
            Isa::Amx => Isa::Avx512Bf16,
            Isa::Avx512Bf16 => Isa::Avx512,
            Isa::Avx512 => Isa::Avx2,
            _ => Isa::Portable,
        }
    }
}

/// How the kernels' level was chosen: what CPUID advertised, the `PPL_ISA` cap, and the
/// level used, the highest at most both whose instructions were seen to execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsaChoice {
    /// What CPUID advertises.
    pub advertised: Isa,
    /// `PPL_ISA`, when set to a level's name.
    pub cap: Option<Isa>,
    /// The level the kernels run at.
    pub used: Isa,
}

impl IsaChoice {
    /// Probes from `min(advertised, cap)` down and keeps the first level that `executes`
    /// (Portable always does). Pure apart from `executes`, so the logic is testable without
    /// the process-wide detection.
    pub fn choose(
        advertised: Isa,
        cap: Option<Isa>,
        mut executes: impl FnMut(Isa) -> bool,
    ) -> Self {
        let mut choice = IsaChoice {
            advertised,
            cap,
            used: Isa::Portable,
        };
        choice.used = choice.allowed();
        while choice.used > Isa::Portable && !executes(choice.used) {
            choice.used = choice.used.below();
        }
        choice
    }

    /// The level advertised and allowed by the cap, before the probe.
    pub fn allowed(&self) -> Isa {
        self.cap.map_or(self.advertised, |c| self.advertised.min(c))
    }

    /// Whether the allowed level (or more) failed to execute, so a lower one is used.
    pub fn failed_to_execute(&self) -> bool {
        self.used < self.allowed()
    }

    /// One line for `ppl validate` and results.json, e.g.
    /// `avx512 (advertised: avx512, executes)`.
    pub fn summary(&self) -> String {
        let allowed = self.allowed();
        let mut s = format!(
            "{} (advertised: {}",
            self.used.name(),
            self.advertised.name()
        );
        if allowed < self.advertised {
            s += &format!(", capped by PPL_ISA={}", allowed.name());
        }
        if self.failed_to_execute() {
            s += &format!(", {} does not execute", allowed.name());
        } else if self.used > Isa::Portable {
            s += ", executes";
        }
        s + ")"
    }
}

/// The process-wide choice: CPUID, confirmed by running the instructions in a child process
/// (see [`probe`]), capped by `PPL_ISA` (`portable`, `avx2`, `avx512`, `avx512bf16`, `amx`);
/// detected once. For AMX this also requests the tile-data permission (once per process,
/// before any thread uses a tile) and checks the tile unit against the instructions'
/// definitions.
pub fn isa_choice() -> IsaChoice {
    use std::sync::OnceLock;
    static CHOICE: OnceLock<IsaChoice> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let cap = std::env::var("PPL_ISA")
            .ok()
            .as_deref()
            .and_then(Isa::parse);
        let choice = IsaChoice::choose(advertised(), cap, probe::executes);
        if choice.failed_to_execute() {
            tracing::warn!(
                "CPUID advertises {} but its instructions do not execute here (the probe \
                 process did not exit cleanly); kernels use {}",
                choice.allowed().name(),
                choice.used.name()
            );
        }
        choice
    })
}

/// The level our kernels run at (see [`isa_choice`]).
pub fn isa() -> Isa {
    isa_choice().used
}

/// Whether the BF16 kernel multiplies on the tile unit (`tdpbf16ps`): the process uses
/// [`Isa::Amx`], CPUID advertises AMX-BF16, a probe child ran the instruction cleanly and the
/// tile unit computes [`rows16::tiles::bf16_known_answer_program`] as the instruction's
/// definition does — which is the order the other levels' BF16 kernels follow, so the answer
/// is the same bits; where the hardware differs, the BF16 kernel stays on `vdpbf16ps` (with a
/// warning) and the bits are still the same. Decided once.
pub fn bf16_tiles() -> bool {
    use std::sync::OnceLock;
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(|| {
        if isa() < Isa::Amx {
            return false;
        }
        #[cfg(all(target_arch = "x86_64", unix))]
        {
            if !amx_bf16_advertised() {
                return false;
            }
            if !probe::bf16_tiles_execute() {
                tracing::warn!("AMX-BF16 is advertised but tdpbf16ps did not run cleanly in the probe process; BF16 weights use vdpbf16ps");
                return false;
            }
            let same = rows16::tiles::hardware_bf16_matches_definition();
            if !same {
                tracing::warn!("this CPU's tdpbf16ps does not compute the known-answer program as the instruction's definition does; BF16 weights use vdpbf16ps");
            }
            same
        }
        #[cfg(not(all(target_arch = "x86_64", unix)))]
        false
    })
}

/// [`IsaChoice::summary`] of this process, and from the AVX-512 BF16 level up how BF16
/// weights are multiplied (on the tiles; with `vdpbf16ps`; or with FMAs where those time
/// faster, [`bf16::vdpbf16ps_pays`]): the line `ppl validate` prints and results.json
/// records.
pub fn kernels_summary() -> String {
    let choice = isa_choice();
    let mut s = choice.summary();
    if choice.used >= Isa::Amx && bf16_tiles() {
        s += "; BF16 on the tiles";
    } else if choice.used >= Isa::Avx512Bf16 {
        s += if bf16::vdpbf16ps_pays() {
            "; BF16 on vdpbf16ps"
        } else {
            "; BF16 on FMA (faster than vdpbf16ps here)"
        };
    }
    s
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22).
#[cfg(target_arch = "x86_64")]
fn amx_bf16_advertised() -> bool {
    use std::arch::x86_64::__cpuid_count;
    __cpuid_count(0, 0).eax >= 7 && __cpuid_count(7, 0).edx & (1 << 22) != 0
}

/// Helpers of the AVX-512 micro-kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::panel::PANEL;
    use std::arch::x86_64::*;

    /// The outputs `[panel row][weight row]` of an interleaved-rows kernel (Q4_0, Q8_0/Q5_0,
    /// Q4_K, Q6_K) from its accumulators, one register per panel row and one lane per weight
    /// row of the group of sixteen: a store per register.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn lanes_to_outputs(acc: &[__m512; PANEL]) -> [[f32; 16]; PANEL] {
        let mut rows = [[0f32; 16]; PANEL];
        for (row, acc) in rows.iter_mut().zip(acc) {
            _mm512_storeu_ps(row.as_mut_ptr(), *acc);
        }
        rows
    }
}

/// Confirms that an advertised instruction set executes: some machines advertise AVX-512 in
/// CPUID that traps (SIGILL) when used, so a child process runs a few of the level's
/// instructions first and only a clean exit counts.
mod probe {
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
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// For tests that need the AMX level where this process does not run it: prints why the
    /// test is skipped, or fails when `PPL_REQUIRE_AMX=1` (set by `.ci/run` where
    /// `/proc/cpuinfo` lists `amx_int8`), so a CPU with AMX never skips silently.
    pub(crate) fn amx_skipped(choice: &IsaChoice) {
        let why = format!(
            "SKIPPED: AMX not in use here, kernels: {}",
            choice.summary()
        );
        if std::env::var("PPL_REQUIRE_AMX").is_ok_and(|v| v == "1") {
            panic!("PPL_REQUIRE_AMX=1 but {why}");
        }
        eprintln!("{why}");
    }

    #[test]
    fn the_level_is_the_highest_that_executes_under_the_cap() {
        use Isa::*;
        let all = |_: Isa| true;
        assert_eq!(IsaChoice::choose(Avx512, None, all).used, Avx512);
        assert_eq!(IsaChoice::choose(Avx512, Some(Avx2), all).used, Avx2);
        assert_eq!(
            IsaChoice::choose(Avx512, Some(Portable), all).used,
            Portable
        );
        assert_eq!(IsaChoice::choose(Avx2, Some(Avx512), all).used, Avx2);
        // Advertised AVX-512 that traps: AVX2, said so.
        let no512 = |l: Isa| l < Avx512;
        let c = IsaChoice::choose(Avx512, None, no512);
        assert_eq!(c.used, Avx2);
        assert!(c.failed_to_execute());
        assert_eq!(
            c.summary(),
            "avx2 (advertised: avx512, avx512 does not execute)"
        );
        // A cap below the failing level: nothing failed that was wanted.
        let c = IsaChoice::choose(Avx512, Some(Avx2), no512);
        assert_eq!((c.used, c.failed_to_execute()), (Avx2, false));
        assert_eq!(
            c.summary(),
            "avx2 (advertised: avx512, capped by PPL_ISA=avx2, executes)"
        );
        // Nothing executes: portable; the portable level is never probed.
        let c = IsaChoice::choose(Avx512, None, |l| {
            assert!(l > Portable);
            false
        });
        assert_eq!(c.used, Portable);
        assert_eq!(
            IsaChoice::choose(Avx512, None, all).summary(),
            "avx512 (advertised: avx512, executes)"
        );
        assert_eq!(Isa::parse(" AVX512 "), Some(Avx512));
        assert_eq!(Isa::parse("avx512_bf16"), Some(Avx512Bf16));
        // A BF16 level that does not execute falls back to plain AVX-512.
        let c = IsaChoice::choose(Avx512Bf16, None, |l| l < Avx512Bf16);
        assert_eq!(c.used, Avx512);
        assert_eq!(
            IsaChoice::choose(Avx512Bf16, Some(Avx512), all).used,
            Avx512
        );
        assert_eq!(Isa::parse("portable"), Some(Portable));
        assert_eq!(Isa::parse("AMX"), Some(Amx));
        // AMX that does not execute (no permission, a trap, a wrong known answer): the BF16
        // level, said so; capped, it is not probed.
        let c = IsaChoice::choose(Amx, None, |l| l < Amx);
        assert_eq!(c.used, Avx512Bf16);
        assert_eq!(
            c.summary(),
            "avx512bf16 (advertised: amx, amx does not execute)"
        );
        let c = IsaChoice::choose(Amx, Some(Avx512), |l| {
            assert!(l <= Avx512);
            true
        });
        assert_eq!(c.used, Avx512);
        assert_eq!(Isa::parse("sse"), None);
    }

    #[test]
    fn the_probe_confirms_at_most_what_is_advertised() {
        let found = isa_choice();
        assert!(found.used <= found.advertised);
        assert_eq!(found.used, isa());
        // The level chosen (and the ones below it) passes its probe again.
        for level in [Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx] {
            if level <= found.used {
                assert!(probe::executes(level), "{level:?}");
            }
        }
    }

    #[cfg(all(target_arch = "x86_64", unix))]
    #[test]
    fn the_probe_rejects_a_trapping_failing_or_hanging_child() {
        use probe::{run_child, Verdict};
        use std::time::Duration;
        let bound = Duration::from_millis(300);
        assert_eq!(run_child(|| true, bound), Verdict::Clean);
        assert_eq!(run_child(|| false, bound), Verdict::Failed);
        // SAFETY: `ud2` raises SIGILL in the child, which is what is tested.
        let trap = || unsafe {
            std::arch::asm!("ud2");
            true
        };
        assert_eq!(run_child(trap, bound), Verdict::Failed);
        let hang = || loop {
            std::hint::spin_loop()
        };
        assert_eq!(run_child(hang, bound), Verdict::Failed);
    }
}
