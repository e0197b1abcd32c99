//! The 4-bit formats, Q4_0 (`d·(n − 8)`), Q4_1 (`d·n + m`) and IQ4_NL (`d·table[n]`), × f32
//! activations: each
//! activation row quantized to Q8_0/Q8_1 (32-value blocks, scale `d`, `s = d·Σq` rounded to
//! f16: [`super::Q8Panels`], as llama.cpp's CPU backend quantizes them), each output
//! `Σ_blocks d_w·d_a·Σ(n_w·q_a)` with Q4_0's `− 8·Σq_a` inside the integer sum and Q4_1's
//! `+ m_w·s_a` after it.
//!
//! Why this layout: the first kernels of ours mirrored ggml's `vec_dot_q4_0_q8_0` and
//! `vec_dot_q4_1_q8_1`, eight float lanes per output, so every block of every output cost
//! eight conversions and FMAs besides the integer products, and every weight row decoded its
//! nibbles again per panel (SmolLM2 Q4_0: 0.53× llama.cpp, which repacks Q4_0 rows
//! interleaved; SmolLM2 Q4_1 at 44% of the f32 FMA peak when Q4_0 ran at 115%). Here the
//! weights are repacked at load, in place of the file's bytes (as many per block as in the
//! file), into groups of [`GROUP`] rows whose blocks are interleaved: per block, the group's
//! sixteen f16 scales `d` (Q4_1: then its sixteen f16 minima `m`), then four 64-byte runs where
//! run `t` holds, for each row `j` of the group, the file's nibble bytes `4t..4t+4` of that
//! row's block (low nibbles: values `4t..4t+4`, high nibbles: values `16+4t..16+4t+4`). One
//! 32-bit lane per weight row: a broadcast of four activation bytes meets sixteen rows' four
//! weights in one `vpdpbusd`, and each output's whole-block integer sum lands in its own
//! lane, converted and scaled once per block.
//!
//! Float order, fixed per output element whatever the level, thread count or neighbours, over
//! the blocks in order from zero: `acc = fma(d_w·d_a, Σ_{e<32} n_e·q_a[e] − o·Σq_a, acc)` with
//! `o` = 8 for Q4_0, 0 for Q4_1; then, Q4_1 only, `acc = fma(m_w, s_a, acc)`. The integer
//! sums are exact whichever instructions form them (unsigned nibble times signed activation;
//! no saturation: 15·127·2 < 2¹⁵), so the AVX-512 VNNI path (sixteen rows per register), the
//! AVX2 path (eight), the AMX path (a tile of eight panel rows × sixteen weight rows per
//! block, `tdpbsud` on the nibbles unpacked to bytes) and the portable one give the same bits.
//! (Q4_1 was a panel kernel in ggml's eight-lane order before: its bits moved in the low
//! digits when it joined this driver.)
//!
//! IQ4_NL has Q4_0's block and layout; its nibble indexes ggml's table of sixteen signed
//! bytes ([`IQ4_NL_VALUES`]). The SIMD kernels look each nibble up (`vpshufb`) as the byte
//! `table[n] + 128` and subtract `128·Σq_a` (the `o` above is 128, the product unsigned ×
//! signed as Q4_0's); the AVX2 kernel, whose `maddubs` pairs would saturate on such bytes,
//! multiplies `|table[n]|` by the activation with the value's sign, as llama.cpp does, and
//! widens every step; the portable one takes `table[n]` itself. All form the same integer
//! `Σ table[n]·q_a`. The reader hands IQ4_NL tensors over as the Q8_0 tensors of the same
//! values ([`crate::model::gguf::transcode`]); [`Iq4NlRows16::from_q8_0`] takes those back
//! to 18 bytes a block.

use half::f16;

use super::{Format, GroupOut, Job, Q8Panel, Q8Panels, Rows16Matrix, GROUP, MINIMA};
pub use crate::model::gguf::transcode::IQ4_NL_VALUES;

/// A 4-bit format of the interleaved-rows driver: Q4_0 without minima ([`Q4_0`]), Q4_1 with
/// ([`Q4_1`]), IQ4_NL (`NL`: the nibble indexes [`IQ4_NL_VALUES`], no minima: [`Iq4Nl`]).
pub struct FourBit<const MIN: bool, const NL: bool = false>;

/// GGUF Q4_0: f16 d, 16 bytes of nibbles; value `d·(n − 8)`.
pub type Q4_0 = FourBit<false>;
/// GGUF Q4_1: f16 d, f16 m, 16 bytes of nibbles; value `d·n + m`.
pub type Q4_1 = FourBit<true>;
/// GGUF IQ4_NL: f16 d, 16 bytes of nibbles; value `d·IQ4_NL_VALUES[n]`.
pub type Iq4Nl = FourBit<false, true>;

/// A Q4_0 weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 18 bytes
/// per block, as in the file (plus the last group's padding rows).
pub type Q4_0Rows16 = Rows16Matrix<Q4_0>;
/// A Q4_1 weight matrix `[n, k]`, likewise: 20 bytes per block.
pub type Q4_1Rows16 = Rows16Matrix<Q4_1>;
/// An IQ4_NL weight matrix `[n, k]`, likewise: 18 bytes per block.
pub type Iq4NlRows16 = Rows16Matrix<Iq4Nl>;

/// A job of these formats.
pub(crate) type Q4Job<'a> = Job<'a, Q8Panel<'a>>;

/// IQ4_NL's table as the SIMD kernels' unsigned bytes: `table[n] + 128`.
pub(crate) const IQ4_NL_BYTES: [u8; 16] = {
    let mut bytes = [0u8; 16];
    let mut n = 0;
    while n < 16 {
        bytes[n] = (IQ4_NL_VALUES[n] as i16 + 128) as u8;
        n += 1;
    }
    bytes
};

impl<const MIN: bool, const NL: bool> FourBit<MIN, NL> {
    /// Bytes of f16 scales per row's block: `d`, and `m` for Q4_1.
    const SCALE_BYTES: usize = if MIN { 4 } else { 2 };
    /// Offset of the nibbles in a group's block.
    pub(crate) const NIBBLES: usize = Self::SCALE_BYTES * GROUP;
    /// Subtracted from each value byte inside the SIMD kernels' integer sum (the byte is the
    /// nibble, or for IQ4_NL [`IQ4_NL_BYTES`]'s).
    pub(crate) const OFFSET: i32 = if MIN {
        0
    } else if NL {
        128
    } else {
        8
    };

    /// Lane `lane`'s `(d, m)` (`m` = 0 for Q4_0) of a group's block.
    fn scales(src: &[u8], lane: usize) -> (f32, f32) {
        let half = |at: usize| f16::from_le_bytes([src[at], src[at + 1]]).to_f32();
        let m = if MIN { half(MINIMA + 2 * lane) } else { 0.0 };
        (half(2 * lane), m)
    }

    /// Lane `lane`'s nibble `e` (value `e` of the block) of a group's block.
    fn nibble(src: &[u8], lane: usize, e: usize) -> i32 {
        let byte = src[Self::NIBBLES + 64 * ((e % 16) / 4) + 4 * lane + e % 4];
        (if e < 16 { byte & 0x0F } else { byte >> 4 }) as i32
    }
}

impl<const MIN: bool, const NL: bool> Format for FourBit<MIN, NL> {
    type Act = Q8Panels;
    const NAME: &'static str = if NL {
        "IQ4_NL"
    } else if MIN {
        "Q4_1"
    } else {
        "Q4_0"
    };
    const FILE_BLOCK_BYTES: usize = Self::SCALE_BYTES + 16;
    const GROUP_BLOCK_BYTES: usize = GROUP * Self::FILE_BLOCK_BYTES;

    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
        if MIN {
            dst[MINIMA + 2 * lane..][..2].copy_from_slice(&src[2..4]);
        }
        let nibbles = &src[Self::SCALE_BYTES..];
        for t in 0..4 {
            dst[Self::NIBBLES + 64 * t + 4 * lane..][..4].copy_from_slice(&nibbles[4 * t..][..4]);
        }
    }

    /// `(n − 8)·d` (Q4_0), `n·d + m` (Q4_1), `table[n]·d` (IQ4_NL) per value: ggml's (and
    /// candle's) dequantization.
    fn dequantize(src: &[u8], lane: usize, o: &mut [f32]) {
        let (d, m) = Self::scales(src, lane);
        for (e, o) in o.iter_mut().enumerate() {
            let n = Self::nibble(src, lane, e);
            *o = if NL {
                IQ4_NL_VALUES[n as usize] as f32 * d
            } else if MIN {
                n as f32 * d + m
            } else {
                (n - 8) as f32 * d
            };
        }
    }

    fn portable(job: &Q4Job<'_>) -> GroupOut {
        // IQ4_NL's values are signed bytes themselves: no offset here.
        let value = |n: u8| {
            if NL {
                IQ4_NL_VALUES[n as usize]
            } else {
                n as i8
            }
        };
        let offset = if NL { 0 } else { Self::OFFSET };
        super::portable_q8::<MIN>(job, Self::GROUP_BLOCK_BYTES, offset, |src, lane, w| {
            for t in 0..4 {
                let run = &src[Self::NIBBLES + 64 * t + 4 * lane..][..4];
                for (j, &byte) in run.iter().enumerate() {
                    w[4 * t + j] = value(byte & 0x0F);
                    w[16 + 4 * t + j] = value(byte >> 4);
                }
            }
        })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Q4Job<'_>) -> GroupOut {
        if NL {
            x86::group_avx2_signed_table(job)
        } else {
            x86::group_avx2::<MIN>(job)
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Q4Job<'_>) -> GroupOut {
        x86::group_avx512::<MIN, NL>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Q4Job<'_>) -> Option<GroupOut> {
        Some(x86::group_amx::<T, MIN, NL>(tiles, job))
    }
}

impl Iq4NlRows16 {
    /// The IQ4_NL matrix of a Q8_0 tensor `[n, k]` whose every value is one of
    /// [`IQ4_NL_VALUES`] (the form the reader gives IQ4_NL tensors), each block back to its
    /// 18 bytes; `None` if a value is not in the table or the size is not `n·k/32` blocks.
    /// Its products are the Q8_0 kernel's bits: the same values, the same exact block sums,
    /// the same float steps.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        const Q8_0_BLOCK_BYTES: usize = 34;
        // Each byte's index in the table, or `NOT_IN_TABLE`.
        const NOT_IN_TABLE: u8 = 0xFF;
        let mut index = [NOT_IN_TABLE; 256];
        for (i, &v) in IQ4_NL_VALUES.iter().enumerate() {
            index[v as u8 as usize] = i as u8;
        }
        if !bytes.len().is_multiple_of(Q8_0_BLOCK_BYTES) {
            return None;
        }
        let blocks = bytes.chunks_exact(Q8_0_BLOCK_BYTES);
        // Every Q8_0 tensor is offered here: a quantized one stops on its first blocks,
        // before anything is allocated.
        let in_table = |block: &[u8]| {
            block[2..]
                .iter()
                .all(|&q| index[q as usize] != NOT_IN_TABLE)
        };
        if !blocks.clone().all(in_table) {
            return None;
        }
        let mut file = Vec::with_capacity(blocks.len() * Iq4Nl::FILE_BLOCK_BYTES);
        for block in blocks {
            let (d, q) = block.split_at(2);
            file.extend_from_slice(d);
            let index = |q: u8| index[q as usize];
            file.extend((0..16).map(|j| index(q[j]) | (index(q[16 + j]) << 4)));
        }
        Self::from_bytes(&file, n, k)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q4_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q4_tests.rs"]
mod tests;
