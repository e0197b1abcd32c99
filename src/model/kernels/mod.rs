//! Our own CPU kernels, only where a profile showed candle (or our previous kernel) to be the
//! bottleneck. Each has an AVX2 path chosen at run time (the quantized ones also an AVX-512
//! VNNI path) and a portable one that performs the same IEEE operations in the same order, so
//! results are bit-identical at every instruction-set level, for any thread count, batch size
//! or grouping of rows.
//!
//! The level ([`isa`]) is what CPUID advertises, confirmed by executing the instructions in a
//! child process (some machines advertise AVX-512 that traps), capped by `PPL_ISA`.
//!
//! - [`rows16`] (Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q8_0 × Q8_0/Q8_1; Q2_K, Q3_K, Q4_K, Q5_K,
//!   Q6_K × Q8_K): one
//!   driver generic over the block format; the weights repacked at load into interleaved groups of sixteen
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

use crate::model::gguf::transcode::Transcode;

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
        GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K
            if k == 0 || !k.is_multiple_of(kquant::QK_K) =>
        {
            return None
        }
        GgmlDType::Q4K => boxed(rows16::q4k::Q4KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5K => boxed(rows16::q4k::Q5KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q6K => boxed(rows16::q6k::Q6KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q3K => boxed(rows16::q3k::Q3KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q2K => boxed(rows16::q2k::Q2KRows16::from_bytes(bytes, n, k)),
        GgmlDType::Q4_1 => boxed(rows16::q4::Q4_1Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5_0 => boxed(rows16::q8_0::Q5_0Rows16::from_bytes(bytes, n, k)),
        GgmlDType::Q5_1 => boxed(rows16::q8_0::Q5_1Rows16::from_bytes(bytes, n, k)),
        // A Q8_0 tensor of IQ4_NL's values only (an IQ4_NL tensor as the reader gives it:
        // `gguf::transcode`) is held as IQ4_NL, 18 bytes a block instead of 34, with the same
        // bits. A tensor quantized to Q8_0 holds values outside the table (0, 2, 127, …) in
        // its first blocks, where the test stops.
        GgmlDType::Q8_0 => match rows16::q4::Iq4NlRows16::from_q8_0(bytes, n, k) {
            Some(iq4_nl) => boxed(Some(iq4_nl)),
            None => boxed(rows16::q8_0::Q8_0Rows16::from_bytes(bytes, n, k)),
        },
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

/// Our kernel for a stored `[n, k]` matrix of a type the reader rewrites for candle
/// ([`Transcode`]), on its stored bytes: IQ4_NL (18 bytes a block) and IQ4_XS (136 per
/// super-block; rows not a multiple of 256 cannot be IQ4_XS, the reader refuses them).
pub fn own_stored_matrix(
    stored: Transcode,
    bytes: &[u8],
    n: usize,
    k: usize,
) -> Option<Result<Arc<dyn OwnMatrix>, String>> {
    let m = match stored {
        Transcode::Iq4NlAsQ8_0 => rows16::q4::Iq4NlRows16::from_bytes(bytes, n, k)
            .map(|m| Arc::new(m) as Arc<dyn OwnMatrix>),
        Transcode::Iq4XsAsF32 => rows16::iq4xs::Iq4XsRows16::from_bytes(bytes, n, k)
            .map(|m| Arc::new(m) as Arc<dyn OwnMatrix>),
    };
    Some(m.ok_or_else(|| format!("a malformed {} layout for [{n}, {k}]", stored.stored_name())))
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
    if choice.used >= Isa::Amx {
        s += &format!("; {}", rows16::tiles_pay::summary());
    }
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

mod probe;

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
