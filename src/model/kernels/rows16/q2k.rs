//! Q2_K weights repacked at load into interleaved groups of [`GROUP`] rows, × Q8_K
//! activations: the kernels of [`super::q6k`] ([`SixteenSubBlocks`]: sixteen 16-value
//! sub-blocks with byte scales), with Q2_K's mins ([`SubBlockValues::MINS`]). Its two-bit
//! values lie where Q3_K keeps its low bits ([`super::q3k::pack_low_bits`]) and are taken as
//! `u = q + 1` (offset 1, the smallest the shared kernels express: `2^0`), its scales and
//! mins unpacked from their nibbles to bytes.
//!
//! Layout, per group of sixteen rows and super-block (1600 bytes for the file's 16 × 84):
//! - `[0, 32)`: the rows' f16 `d`, lane `j` at `2j`;
//! - `[32, 288)`: the scales (0..=15), sub-block `s` at `32 + 16s`, row `j`'s at byte `j`;
//! - `[288, 1312)`: the values, one 64-byte run per sub-block: run `s`, byte `4j + c`, bits
//!   `2t, 2t + 1` for value `16s + 4t + c` of row `j`;
//! - `[1312, 1344)`: the rows' f16 `dmin`; `[1344, 1600)`: the mins, laid out as the scales.
//!
//! Float order, per output, on every level: per super-block the exact
//! `sum = Σ_s scale_s·Σ_e q_e·a_e` and `mins = Σ_s min_s·bsum_s`, then over the super-blocks in
//! order, from zero, `acc = fma(d_w·d_a, sum, acc)` and `acc_min = fma(dmin_w·d_a, mins,
//! acc_min)`; the output is `acc − acc_min` (Q4_K's; ggml's structure, one float product each
//! per super-block of exact integer sums). The tile level stages each value times its scale
//! as one signed byte (at most 3·15 = 45: one tile per 64-value chunk, where Q6_K needs two).

use super::q3k::{low_bits, pack_low_bits, LOW};
use super::q6k::{SixteenSubBlocks, SubBlockValues, SCALES};
use super::{Rows16Matrix, GROUP};
use crate::model::kernels::kquant::q2k::Q2KBlock;
use crate::model::kernels::kquant::SuperBlock;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Offset of the f16 `dmin` in a group's super-block (the mins follow).
const DMIN: usize = LOW + 16 * 64;
/// Offset of the mins.
const MINS: usize = DMIN + 2 * GROUP;

/// The Q2_K values: two bits, with scales and mins.
pub struct Q2KValues;

/// The Q2_K format of the interleaved-rows driver.
pub type Q2K = SixteenSubBlocks<Q2KValues>;

/// A Q2_K weight matrix `[n, k]`, repacked in interleaved groups of [`GROUP`] rows: 100 bytes
/// per super-block (the file's 84, scales and mins unpacked), plus the last group's padding
/// rows.
pub type Q2KRows16 = Rows16Matrix<Q2K>;

impl SubBlockValues for Q2KValues {
    const NAME: &'static str = "Q2_K";
    const FILE_BLOCK_BYTES: usize = Q2KBlock::FILE_BYTES;
    const GROUP_BLOCK_BYTES: usize = MINS + 16 * GROUP;
    /// `u = q + 1`.
    const OFFSET_BITS: u32 = 0;
    /// All four: 4 · 2 · 4 · 128 = 4096.
    const STEPS_IN_16_BITS: usize = 4;
    const MINS: Option<usize> = Some(DMIN);
    /// `q·scale ≤ 3·15`: one signed byte.
    const STAGED_TILES: usize = 1;

    fn pack(file: &[u8], dst: &mut [u8], lane: usize) {
        let blk = Q2KBlock::decode(file);
        dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.to_le_bytes());
        dst[DMIN + 2 * lane..][..2].copy_from_slice(&blk.dmin.to_le_bytes());
        for s in 0..16 {
            dst[SCALES + 16 * s + lane] = blk.scales[s];
            dst[MINS + 16 * s + lane] = blk.mins[s];
        }
        pack_low_bits(blk.bits(), dst, lane);
    }

    fn value(src: &[u8], lane: usize, e: usize) -> u8 {
        low_bits(src, lane, e) + 1
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn values_avx2(src: *const u8, s: usize, half: usize) -> [__m256i; 4] {
        let one = _mm256_set1_epi8(1);
        super::q3k::low_bits_avx2(src, s, half).map(|q| _mm256_add_epi8(q, one))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn values_avx512(src: *const u8, s: usize) -> [__m512i; 4] {
        let one = _mm512_set1_epi8(1);
        super::q3k::low_bits_avx512(src, s).map(|q| _mm512_add_epi8(q, one))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_extreme_blocks, format_tests, Case, SUPER_BLOCK_SHAPES};
    use super::*;
    use crate::model::kernels::kquant::q2k::tests as file;
    use candle_core::quantized::GgmlDType;

    impl Case for Q2K {
        const DTYPE: GgmlDType = GgmlDType::Q2K;
        const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

        fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
            file::random_q2k(n, k, seed)
        }

        fn reference(block: &[u8], e: usize) -> f64 {
            file::reference(block, e)
        }
    }

    format_tests!(Q2K, 43);

    #[test]
    fn memory_is_the_files_bytes_and_the_unpacked_scales_and_mins() {
        let w = Q2KRows16::from_bytes(&vec![0u8; 16 * 2 * 84], 16, 512).expect("layout");
        assert_eq!(w.storage_bytes(), 16 * 2 * 100);
    }

    #[test]
    fn extreme_blocks_give_the_same_bits_on_every_path() {
        // Every value 3 (all bits set) or 0, scales and mins of both extremes (15 and 0),
        // against ±127 activations of one sign and of both.
        check_extreme_blocks::<Q2K>(|b| {
            let mut block: Vec<u8> = (0..16)
                .map(|s| [0xFF, 0x0F, 0xF0, 0x00][(s + b) % 4])
                .collect();
            block.extend(vec![[0xFF, 0x00, 0xFF, 0x55][b % 4]; 64]);
            let (d, dmin) = if b % 2 == 0 { (1.0, 0.5) } else { (-0.25, 2.0) };
            block.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            block.extend_from_slice(&half::f16::from_f32(dmin).to_le_bytes());
            block
        });
    }
}
