//! Q6_K weights repacked at load into interleaved groups of [`GROUP`] rows, × Q8_K activations;
//! and the kernels of every format of sixteen 16-value sub-blocks with signed byte scales
//! ([`SixteenSubBlocks`]: Q6_K here, Q3_K in [`super::q3k`], Q2_K with its mins in
//! [`super::q2k`]), which differ only in where their unsigned values lie, their offset and
//! whether mins follow ([`SubBlockValues`]).
//!
//! Why: the panel kernel this replaced (since removed) decoded a super-block of one weight
//! row and met eight activation rows with it, every product of a row landing in the lanes of its own
//! register, so each super-block ended in a horizontal reduction and per-row offset fix-ups;
//! a profile of the Llama-3.2-1B shape in Q6_K spent 54% of the time there (0.61× llama.cpp).
//! Here, as in [`super::q4`], one 32-bit lane belongs to one weight row: a broadcast
//! of four activation bytes meets sixteen rows' four weights in one `vpdpbusd`, the sum of a
//! 16-value sub-block forms in each row's lane, is multiplied by that row's scale in one
//! `vpmulld`, and nothing is ever reduced across lanes.
//!
//! Layout, per group of sixteen rows and super-block (16 × 210 bytes, the file's size):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`;
//! - `[32, 288)`: the scales, sub-block `s` at `32 + 16s`, row `j`'s at byte `j`;
//! - `[288, 2336)`: the low four bits, two 64-byte runs per sub-block: run `2s + u`, bytes
//!   `4j..4j + 4`, hold in their low nibbles values `16s + 4u + c` (c < 4) of row `j`, in
//!   their high nibbles values `16s + 8 + 4u + c`;
//! - `[2336, 3360)`: the top two bits, one 64-byte run per sub-block: run `s`, byte `4j + c`,
//!   bits `2t, 2t + 1` for value `16s + 4t + c` of row `j`.
//!
//! Float order, per output, ggml's structure and the removed panel kernel's (so the same bits
//! as before the repacking): the super-block's sum `Σ_s scale_s·Σ_e (q_e − 32)·a_e` is exact in i32 (the
//! SIMD paths start each sub-block's sum at `−32·bsum_s` and add the unsigned products), then
//! `acc = fma(d_w·d_a, sum as f32, acc)` over the super-blocks in order, from zero. The
//! AVX-512 VNNI path (sixteen rows per register), the AVX2 path (eight), the AMX path (each
//! value times its scale staged as one or two signed bytes, a super-block's scaled sums formed
//! in the tiles: `scaled_tiles_x86::run_scaled`) and the portable one give the same bits.

use std::marker::PhantomData;

use half::f16;

use super::{decoded_blocks, dot_i8, lane_f16, Format, GroupOut, Job, Rows16Matrix, GROUP};
use crate::model::kernels::kquant::q6k::Q6KBlock;
use crate::model::kernels::kquant::q8k::{Q8KPanel, Q8KPanels};
use crate::model::kernels::kquant::{SuperBlock, QK_K};
use crate::model::kernels::panel::PANEL;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m256i, __m512i};

/// Offset of the scales in a group's super-block (after the sixteen f16 `d`): sub-block `s`
/// at `SCALES + 16s`, row `j`'s signed byte at `j`. Every [`SubBlockValues`] format's values
/// follow at [`VALUES`].
pub(crate) const SCALES: usize = 2 * GROUP;
/// Offset of a format's values in a group's super-block.
pub(crate) const VALUES: usize = SCALES + 16 * GROUP;
/// Offset of Q6_K's low four bits.
const NIBBLES: usize = VALUES;
/// Offset of Q6_K's top two bits.
const HIGH: usize = NIBBLES + 32 * 64;
/// Sub-blocks of 16 values per super-block.
const SUB_BLOCKS: usize = QK_K / 16;

/// What a format of sixteen 16-value sub-blocks, one signed byte scale each and an f16 `d`
/// per super-block (value `d·scale·q`), supplies to [`SixteenSubBlocks`]: its values, stored
/// unsigned as `u = q + 2^OFFSET_BITS` from [`VALUES`] on in a layout of its own, and the
/// repacking of its file blocks. Everything else — the kernels of every level, the offsets
/// through the activation sums, the tile staging — is shared.
pub trait SubBlockValues: Send + Sync + 'static {
    /// The format's name, as GGUF spells it.
    const NAME: &'static str;
    /// Bytes of one super-block in a GGUF file.
    const FILE_BLOCK_BYTES: usize;
    /// Bytes of one super-block of a group: `d`, scales, values.
    const GROUP_BLOCK_BYTES: usize;
    /// `q = u − 2^OFFSET_BITS`.
    const OFFSET_BITS: u32;
    /// How many `maddubs` steps of the AVX2 kernel (each lane's two products of a value and
    /// a signed activation byte, |a| ≤ 128) are added in 16 bits before one `madd` widens
    /// them: `steps · 2 · max u · 128 < 2¹⁵`, and a divisor of a sub-block's four steps.
    const STEPS_IN_16_BITS: usize;
    /// Where a format with mins (value `d·scale·q − dmin·min`: Q2_K) keeps them in a group's
    /// super-block: the rows' f16 `dmin` from this offset (lane `j` at `2j`), then sub-block
    /// `s`'s unsigned byte mins at `+32 + 16s` (row `j`'s at byte `j`); `None` for the formats
    /// without (Q6_K, Q3_K). With mins, each super-block also forms the exact
    /// `mins = Σ_s min_s·bsum_s` and adds `fma(dmin_w·d_a, mins, acc_min)` to an accumulator of
    /// its own, and the output is `acc − acc_min` (Q4_K's order), on every level.
    const MINS: Option<usize> = None;
    /// How many signed bytes the tile kernel stages per value: each value `q` times its
    /// sub-block's scale, `p = q·scale`, is one byte where every such product is (Q2_K:
    /// 0..=3 × 0..=15), else two, `p = 128·h + l` with `l` in −64..=63 (`|p| ≤ 4096`, so `h`
    /// in −32..=32: Q6_K's −32..=31 × any i8 scale, Q3_K's −4..=3 × −32..=31).
    const STAGED_TILES: usize = 2;

    /// Writes one row's file super-block into lane `lane` of a group's super-block: its f16
    /// `d` at `2·lane`, its scales at `SCALES + 16s + lane`, its values.
    fn pack(file: &[u8], dst: &mut [u8], lane: usize);

    /// The unsigned value `u` of value `e` of lane `lane` in a group's super-block.
    fn value(src: &[u8], lane: usize, e: usize) -> u8;

    /// Sub-block `s`'s values of rows `8·half..8·half + 8` as bytes: register `t` holds values
    /// `16s + 4t..16s + 4t + 4` of each row (bytes `4j..4j + 4`: row `8·half + j`).
    ///
    /// # Safety
    /// The CPU must support AVX2; `src` is a group's super-block.
    #[cfg(target_arch = "x86_64")]
    unsafe fn values_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4];

    /// Sub-block `s`'s values of the sixteen rows, as [`SubBlockValues::values_avx2`] (row
    /// `j` in bytes `4j..4j + 4`): by default its two halves side by side, the unpacking the
    /// AVX2 level runs (a format may unpack all sixteen rows at once instead, as Q6_K does).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW; `src` is a group's super-block.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn values_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
        use std::arch::x86_64::{_mm512_castsi256_si512, _mm512_inserti64x4};
        let (low, high) = (Self::values_avx2(src, s, 0), Self::values_avx2(src, s, 1));
        std::array::from_fn(|t| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low[t]), high[t]))
    }
}

/// The interleaved-rows format of a [`SubBlockValues`] layout.
pub struct SixteenSubBlocks<V>(PhantomData<V>);

/// The Q6_K values: a nibble and two top bits.
pub struct Q6KValues;

/// The Q6_K format of the interleaved-rows driver.
pub type Q6K = SixteenSubBlocks<Q6KValues>;

/// A Q6_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 210 bytes
/// per super-block, as in the file (plus the last group's padding rows).
pub type Q6KRows16 = Rows16Matrix<Q6K>;

/// A job of these formats.
pub(crate) type Q6KJob<'a> = Job<'a, Q8KPanel<'a>>;

/// Where the four low bits (byte, high nibble?) and the two top bits (byte, shift) of value
/// `e` of lane `j` lie in a group's super-block.
fn value_place(j: usize, e: usize) -> ((usize, bool), (usize, usize)) {
    let (s, i) = (e / 16, e % 16);
    let (t, c) = (i / 4, i % 4);
    let nibble = NIBBLES + 64 * (2 * s + t % 2) + 4 * j + c;
    let high = HIGH + 64 * s + 4 * j + c;
    ((nibble, t >= 2), (high, 2 * t))
}

/// Writes one row's super-block (the file's 210 bytes) into lane `lane` of a group's
/// super-block, eight values at a time with word arithmetic: the repacking is part of every
/// load (byte by byte it was a fifth of a 1B Q6_K model's set-up).
///
/// Sub-block `s = 8h + 2i + r` holds values `128h + 32i + 16r + x` (x < 16): their low bits
/// are 16 consecutive bytes of the file's `ql` from `64h + 32(i mod 2) + 16r` (high nibbles
/// when i ≥ 2), their top bits 16 consecutive bytes of `qh` from `128 + 32h + 16r`, at bit
/// `2i` (as `Q6KBlock::value`).
fn pack_super_block(file: &[u8], dst: &mut [u8], lane: usize) {
    const LOW4: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const LOW2: u64 = 0x0303_0303_0303_0303;
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[..8]);
        u64::from_le_bytes(w)
    };
    dst[2 * lane..2 * lane + 2].copy_from_slice(&file[208..210]);
    for (s, &scale) in file[192..208].iter().enumerate() {
        dst[SCALES + 16 * s + lane] = scale;
    }
    for s in 0..SUB_BLOCKS {
        let (h, i, r) = (s / 8, (s % 8) / 2, s % 2);
        let ql = &file[64 * h + 32 * (i % 2) + 16 * r..][..16];
        let qh = &file[128 + 32 * h + 16 * r..][..16];
        let (low_shift, high_shift) = (4 * (i / 2) as u32, 2 * i as u32);
        // Bytes x of `low_a`/`low_b`: the low four bits of values x and 8 + x.
        let low_a = (word(&ql[..8]) >> low_shift) & LOW4;
        let low_b = (word(&ql[8..]) >> low_shift) & LOW4;
        // Runs 2s and 2s + 1: values 4u + c in the low nibbles, 8 + 4u + c in the high.
        let runs = (low_a | (low_b << 4)).to_le_bytes();
        dst[NIBBLES + 64 * (2 * s) + 4 * lane..][..4].copy_from_slice(&runs[..4]);
        dst[NIBBLES + 64 * (2 * s + 1) + 4 * lane..][..4].copy_from_slice(&runs[4..]);
        // Byte c of run s: value 4t + c's top bits at bits 2t (t < 4).
        let high_a = (word(&qh[..8]) >> high_shift) & LOW2;
        let high_b = (word(&qh[8..]) >> high_shift) & LOW2;
        let top = (high_a & 0xFFFF_FFFF)
            | ((high_a >> 32) << 2)
            | ((high_b & 0xFFFF_FFFF) << 4)
            | ((high_b >> 32) << 6);
        dst[HIGH + 64 * s + 4 * lane..][..4].copy_from_slice(&top.to_le_bytes()[..4]);
    }
}

/// The unsigned 6-bit value (0..64) of value `e` of lane `lane` in a group's super-block.
fn q6k_value(src: &[u8], lane: usize, e: usize) -> u8 {
    let ((nibble, upper), (high, shift)) = value_place(lane, e);
    let low = if upper {
        src[nibble] >> 4
    } else {
        src[nibble] & 0x0F
    };
    low | (((src[high] >> shift) & 3) << 4)
}

impl SubBlockValues for Q6KValues {
    const NAME: &'static str = "Q6_K";
    const FILE_BLOCK_BYTES: usize = Q6KBlock::FILE_BYTES;
    const GROUP_BLOCK_BYTES: usize = GROUP * Q6KBlock::FILE_BYTES;
    const OFFSET_BITS: u32 = 5;
    /// 2 · 2 · 63 · 128 = 32256.
    const STEPS_IN_16_BITS: usize = 2;

    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        pack_super_block(file, dst, lane)
    }

    fn value(src: &[u8], lane: usize, e: usize) -> u8 {
        q6k_value(src, lane, e)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn values_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4] {
        x86::q6k_values_avx2(src, s, half)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn values_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
        x86::q6k_values_avx512(src, s)
    }
}

impl<V: SubBlockValues> Format for SixteenSubBlocks<V> {
    type Act = Q8KPanels;
    const NAME: &'static str = V::NAME;
    const FILE_BLOCK_BYTES: usize = V::FILE_BLOCK_BYTES;
    const GROUP_BLOCK_BYTES: usize = V::GROUP_BLOCK_BYTES;

    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        V::pack(file, dst, lane)
    }

    /// The numbers and float operations of ggml's (and candle's) Q6_K and Q3_K
    /// dequantization, `(d·scale)·q`, and Q2_K's, `(d·scale)·q − dmin·min`.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]) {
        let d = f16::from_le_bytes([src[2 * lane], src[2 * lane + 1]]).to_f32();
        let offset = 1i32 << V::OFFSET_BITS;
        for (e, o) in out.iter_mut().enumerate() {
            let scale = src[SCALES + 16 * (e / 16) + lane] as i8;
            let q = V::value(src, lane, e) as i32 - offset;
            let dl = d * scale as f32;
            *o = match V::MINS {
                None => dl * q as f32,
                Some(at) => {
                    let min = src[at + 2 * GROUP + 16 * (e / 16) + lane];
                    dl * q as f32 - lane_f16(src, at, lane) * min as f32
                }
            };
        }
    }

    fn portable(job: &Q6KJob<'_>) -> GroupOut {
        let mut acc = [[0f32; GROUP]; PANEL];
        let mut acc_min = [[0f32; GROUP]; PANEL];
        // The unsigned values less their offset: signed bytes.
        let offset = 1i32 << V::OFFSET_BITS;
        let decode = |src: &[u8], lane: usize, w: &mut [i8; QK_K]| {
            for (e, w) in w.iter_mut().enumerate() {
                *w = (V::value(src, lane, e) as i32 - offset) as i8;
            }
        };
        decoded_blocks(
            job.group,
            job.nb,
            V::GROUP_BLOCK_BYTES,
            decode,
            |b, src, w| {
                for (lane, w) in w.iter().enumerate() {
                    let d = lane_f16(src, 0, lane);
                    for (r, (acc, acc_min)) in acc.iter_mut().zip(&mut acc_min).enumerate() {
                        let (acc, acc_min) = (&mut acc[lane], &mut acc_min[lane]);
                        let (qa, da) = (&job.a.qs[b * PANEL + r], job.a.d[b * PANEL + r]);
                        let mut sum = 0i32;
                        for s in 0..SUB_BLOCKS {
                            let scale = src[SCALES + 16 * s + lane] as i8 as i32;
                            sum += scale * dot_i8(&w[16 * s..][..16], &qa[16 * s..][..16]);
                        }
                        *acc = (d * da).mul_add(sum as f32, *acc);
                        if let Some(at) = V::MINS {
                            let bsums = &job.a.bsums[b * PANEL + r];
                            let mins: i32 = (0..SUB_BLOCKS)
                                .map(|s| {
                                    src[at + 2 * GROUP + 16 * s + lane] as i32 * bsums[s] as i32
                                })
                                .sum();
                            let dmin = lane_f16(src, at, lane);
                            *acc_min = (dmin * da).mul_add(mins as f32, *acc_min);
                        }
                    }
                }
            },
        );
        if V::MINS.is_some() {
            for (acc, acc_min) in acc.iter_mut().zip(&acc_min) {
                for (a, m) in acc.iter_mut().zip(acc_min) {
                    *a -= m;
                }
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Q6KJob<'_>) -> GroupOut {
        x86::group_avx2::<V>(job)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Q6KJob<'_>) -> GroupOut {
        x86::group_avx512::<V>(job)
    }

    /// The values times their scales, staged as one or two signed bytes each
    /// ([`SubBlockValues::STAGED_TILES`]), so a super-block's scaled sums form in the tiles.
    const STAGED_BLOCK_BYTES: usize = {
        assert!(
            V::STAGED_TILES == 1 || V::STAGED_TILES == 2,
            "a value times its scale is staged in one or two bytes"
        );
        super::scaled_staged_bytes(V::STAGED_TILES)
    };

    #[cfg(target_arch = "x86_64")]
    unsafe fn stage(group: &[u8], nb: usize, blocks: std::ops::Range<usize>, staged: &mut [u8]) {
        x86::stage_scaled_values::<V>(group, nb, blocks, staged)
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_staged<T: super::tiles::Tiles>(
        tiles: &mut T,
        job: &super::StagedJob<'_, Q8KPanel<'_>>,
        acc: &mut [super::StagedAcc],
    ) {
        use super::scaled_tiles_x86::run_scaled;
        let group = (V::GROUP_BLOCK_BYTES, x86::float_step::<V> as _);
        match V::STAGED_TILES {
            1 => run_scaled::<T, 1>(tiles, job, acc, group),
            2 => run_scaled::<T, 2>(tiles, job, acc, group),
            n => unreachable!("{}: {n} staged tiles per chunk", V::NAME),
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn staged_outputs(acc: &super::StagedAcc) -> GroupOut {
        super::scaled_tiles_x86::staged_outputs(acc, V::MINS.is_some())
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "q6k_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "q6k_tests.rs"]
mod tests;
