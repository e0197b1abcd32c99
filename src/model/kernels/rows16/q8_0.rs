//! 8-bit block weights × f32 activations: GGUF Q8_0, Q5_0 (decoded at load to −16..15) and
//! Q5_1 (decoded to 0..31, with its minima). Each activation row is quantized to Q8_0/Q8_1
//! (32-value blocks, scale `d`, `s = d·Σq` rounded to f16; [`super::Q8Panels`], as llama.cpp's
//! CPU backend quantizes them), and each output is `Σ_blocks d_w·d_a·Σ(q_w·q_a)`, plus Q5_1's
//! `Σ_blocks m_w·s_a`.
//!
//! Why: Q5_0 is llama.cpp's fallback type for K-quant rows that are not a multiple of 256
//! (Gemma 3's 640-wide rows, SmolLM2's 576 under `--quantize q4_k_m`), and Q8_0 is the output
//! layer of both test models and every matrix of a Q8_0 file; candle's Q5_0 product has no SIMD
//! path on x86 and its Q8_0 one is per row. Our first kernel mirrored ggml's
//! `vec_dot_q8_0_q8_0` (eight float lanes per output, a horizontal sum per output): the
//! Llama-3.2-1B shape in Q8_0 reached half the arithmetic rate of the Q4_K and Q6_K files
//! (1.03–1.3× llama.cpp against 1.7–1.9×). Here, as in [`super::q4_0`], the weights are
//! repacked at load into groups of [`GROUP`] rows whose blocks are interleaved: per block, the
//! group's sixteen f16 scales, then eight 64-byte runs where run `t` holds, for each row `j`
//! of the group, values `4t..4t+4` of that row's block (the signed bytes). One 32-bit lane per
//! weight row: a broadcast of four activation bytes meets sixteen rows' four weights in one
//! `vpdpbusd`, each output's whole-block integer sum forms in its own lane and nothing is ever
//! reduced across lanes. Q8_0 holds the file's 34 bytes per block; Q5_0 34 (the file's 22,
//! decoded so one kernel serves both); Q5_1 36 (the file's 24: its minima follow the scales).
//! Q5_1 is llama.cpp's fallback for Q5_K rows that are not a multiple of 256 (SmolLM2's in a
//! Q5_K_M file), and candle multiplies it in scalar code.
//!
//! Float order, fixed per output element whatever the level, thread count or neighbours:
//! `acc = fma(d_w·d_a, Σ_{e<32} q_w[e]·q_a[e], acc)`, then for Q5_1 `acc = fma(m_w, s_a, acc)`,
//! over the blocks in order, from zero. The
//! integer sums are exact whichever instructions form them: AVX-512 VNNI multiplies
//! `q_w + 128` (unsigned) by `q_a` and starts from `−128·Σq_a`; AVX2 multiplies Q8_0's `|q_w|`
//! by `q_a` with `q_w`'s sign (pairs below 2¹⁵: 128·127·2), and Q5_0's and Q5_1's values as
//! unsigned 0..31 (Q5_0's plus 16, from `−16·Σq_a`); so the AVX-512 path (sixteen rows per
//! register), the AVX2 path (eight), the AMX path (`tdpbssd` on the runs as stored: they are
//! already the tile's layout) and the portable one give the same bits.

use super::{lane_f16, Format, GroupOut, Job, Q8Panel, Q8Panels, Rows16Matrix, GROUP, MINIMA};

/// Bytes of one GGUF Q5_0 block: f16 d, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_0_BLOCK_BYTES: usize = 22;
/// Bytes of one GGUF Q5_1 block: f16 d, f16 m, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_1_BLOCK_BYTES: usize = 24;
/// Bytes of one GGUF Q8_0 block: f16 d, 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Offset of the values in a group's block: after the scales (and the minima, `MIN`).
pub(crate) const fn values_at<const MIN: bool>() -> usize {
    if MIN {
        4 * GROUP
    } else {
        2 * GROUP
    }
}

/// Bytes of one block of a group: the scales (and minima), then the values.
pub(crate) const fn block_bytes<const MIN: bool>() -> usize {
    values_at::<MIN>() + 32 * GROUP
}

/// The Q8_0 format of the interleaved-rows driver.
pub struct Q8_0;

/// The Q5_0 format: its blocks decoded at load to Q8_0's group layout (values −16..15), and
/// Q8_0's kernels.
pub struct Q5_0;

/// A Q8_0 weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 34 bytes
/// per block (plus the last group's padding rows).
pub type Q8_0Rows16 = Rows16Matrix<Q8_0>;

/// A Q5_0 weight matrix `[n, k]` in Q8_0's group layout: 34 bytes per block.
pub type Q5_0Rows16 = Rows16Matrix<Q5_0>;

/// The Q5_1 format: its blocks decoded at load to bytes 0..31 after the group's scales and
/// minima, and Q8_0's kernels with the minima's step.
pub struct Q5_1;

/// A Q5_1 weight matrix `[n, k]`: 36 bytes per block.
pub type Q5_1Rows16 = Rows16Matrix<Q5_1>;

/// A job of these formats.
pub(crate) type Int8Job<'a> = Job<'a, Q8Panel<'a>>;

/// Writes a block's 32 signed values (`values` decodes them from the file's block) and its
/// scale (and, `MIN`, its minimum: the file's bytes 2..4) into lane `lane` of a group's block.
fn pack_values<const MIN: bool>(
    src: &[u8],
    dst: &mut [u8],
    lane: usize,
    values: impl Fn(&[u8], &mut [u8; 32]),
) {
    dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
    if MIN {
        dst[MINIMA + 2 * lane..][..2].copy_from_slice(&src[2..4]);
    }
    let mut q = [0u8; 32];
    values(src, &mut q);
    for (t, four) in q.chunks_exact(4).enumerate() {
        dst[values_at::<MIN>() + 64 * t + 4 * lane..][..4].copy_from_slice(four);
    }
}

/// Value `e` of lane `lane` in a group's block.
fn weight<const MIN: bool>(src: &[u8], lane: usize, e: usize) -> i8 {
    src[values_at::<MIN>() + 64 * (e / 4) + 4 * lane + e % 4] as i8
}

/// The definition ([`super::portable_q8`]): Q8_0's (and Q5_0's) and, `MIN`, Q5_1's.
fn portable<const MIN: bool>(job: &Int8Job<'_>) -> GroupOut {
    super::portable_q8::<MIN>(job, block_bytes::<MIN>(), 0, |src, lane, w| {
        for (e, w) in w.iter_mut().enumerate() {
            *w = weight::<MIN>(src, lane, e);
        }
    })
}

/// Ggml's Q5_0/Q5_1 value `e` of a file block with its high bits at 2..6 (Q5_0) or 4..8
/// (Q5_1): `nibble | high bit << 4`, 0..31.
fn five_bit(block: &[u8], qh_at: usize, e: usize) -> u8 {
    let qh = u32::from_le_bytes(block[qh_at..qh_at + 4].try_into().expect("4 bytes"));
    let byte = block[qh_at + 4 + e % 16];
    let nibble = if e < 16 { byte & 0x0F } else { byte >> 4 };
    nibble | (((qh >> e) & 1) as u8) << 4
}

impl Format for Q8_0 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q8_0";
    const FILE_BLOCK_BYTES: usize = Q8_0_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = block_bytes::<false>();

    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        pack_values::<false>(src, dst, lane, |b, q| q.copy_from_slice(&b[2..34]));
    }

    /// `d·q` per value: the same numbers as ggml's (and candle's) Q5_0 and Q8_0
    /// dequantization.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let d = lane_f16(src, 0, lane);
        for (e, o) in out.iter_mut().enumerate() {
            *o = weight::<false>(src, lane, e) as f32 * d;
        }
    }

    fn portable(job: &Int8Job<'_>) -> GroupOut {
        portable::<false>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx2_signed(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx512::<false>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Int8Job<'_>) -> Option<GroupOut> {
        Some(x86::group_amx::<T, false>(tiles, job))
    }
}

impl Format for Q5_0 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q5_0";
    const FILE_BLOCK_BYTES: usize = Q5_0_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = block_bytes::<false>();

    /// `(nibble | high bit << 4) − 16`, as a signed byte.
    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        pack_values::<false>(src, dst, lane, |b, q| {
            for (e, q) in q.iter_mut().enumerate() {
                *q = five_bit(b, 2, e).wrapping_sub(16);
            }
        });
    }

    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        Q8_0::dequantize(src, lane, out)
    }

    fn portable(job: &Int8Job<'_>) -> GroupOut {
        Q8_0::portable(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx2_five_bit::<false>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Int8Job<'_>) -> GroupOut {
        Q8_0::avx512(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Int8Job<'_>) -> Option<GroupOut> {
        Q8_0::amx(tiles, job)
    }
}

impl Format for Q5_1 {
    type Act = Q8Panels;
    const NAME: &'static str = "Q5_1";
    const FILE_BLOCK_BYTES: usize = Q5_1_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = block_bytes::<true>();

    /// `nibble | high bit << 4`, 0..31, after the scale and the minimum.
    fn pack(src: &[u8], dst: &mut [u8], lane: usize) {
        pack_values::<true>(src, dst, lane, |b, q| {
            for (e, q) in q.iter_mut().enumerate() {
                *q = five_bit(b, 4, e);
            }
        });
    }

    /// `q·d + m` per value: ggml's (and candle's) Q5_1 dequantization.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let (d, m) = (lane_f16(src, 0, lane), lane_f16(src, MINIMA, lane));
        for (e, o) in out.iter_mut().enumerate() {
            *o = weight::<true>(src, lane, e) as f32 * d + m;
        }
    }

    fn portable(job: &Int8Job<'_>) -> GroupOut {
        portable::<true>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx2_five_bit::<true>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Int8Job<'_>) -> GroupOut {
        x86::group_avx512::<true>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: super::tiles::Tiles>(tiles: &mut T, job: &Int8Job<'_>) -> Option<GroupOut> {
        Some(x86::group_amx::<T, true>(tiles, job))
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q8_0_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q8_0_tests.rs"]
mod tests;
