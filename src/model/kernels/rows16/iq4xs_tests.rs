use super::super::tests::{check_extreme_blocks, format_tests, Case, SUPER_BLOCK_SHAPES};
use super::*;
use crate::model::gguf::transcode::Transcode;
use crate::model::kernels::kquant::iq4xs::tests as file;
use candle_core::quantized::GgmlDType;

impl Case for Iq4Xs {
    /// candle reads IQ4_XS as the reader gives it: its F32 values.
    const DTYPE: GgmlDType = GgmlDType::F32;
    const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        file::random_iq4xs(n, k, seed)
    }

    fn candle_bytes(file: &[u8]) -> Vec<u8> {
        Transcode::Iq4XsAsF32.apply(file)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        file::reference(block, e)
    }
}

format_tests!(Iq4Xs, 53);

#[test]
fn memory_is_the_files_bytes_and_the_unpacked_scales() {
    let w = Iq4XsRows16::from_bytes(&vec![0u8; 16 * 2 * 136], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 138);
}

#[test]
fn every_index_and_scale_lands_where_the_layout_says() {
    // One super-block whose value e has index e mod 16 and sub-block s the scale ls = 7s + 3:
    // every lane reads them back.
    let mut blk = vec![0u8; 136];
    for s in 0..8 {
        let ls = (7 * s + 3) as u16;
        blk[4 + s / 2] |= ((ls & 0x0F) as u8) << (4 * (s % 2));
        let high = u16::from_le_bytes([blk[2], blk[3]]) | (ls >> 4) << (2 * s);
        blk[2..4].copy_from_slice(&high.to_le_bytes());
        for i in 0..32 {
            let index = ((32 * s + i) % 16) as u8;
            blk[8 + 16 * s + i % 16] |= if i < 16 { index } else { index << 4 };
        }
    }
    let mut group = vec![0u8; Iq4Xs::GROUP_BLOCK_BYTES];
    for lane in 0..GROUP {
        Iq4Xs::pack(&blk, &mut group, lane);
    }
    for lane in 0..GROUP {
        for e in 0..QK_K {
            assert_eq!(Iq4Xs::index(&group, lane, e), e % 16, "lane {lane} e {e}");
        }
        for s in 0..8 {
            assert_eq!(Iq4Xs::scale(&group, lane, s) as i32, 7 * s as i32 + 3 - 32);
        }
    }
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every index 0 (−127) or 15 (113), scales at both extremes (ls 0 → −32, 63 → 31) and
    // mixed, against ±127 activations of one sign and of both: the largest sums the AVX-512
    // path forms with its +128 bytes, and the AVX2 path's widest pairs.
    check_extreme_blocks::<Iq4Xs>(|b| {
        let d = if b % 2 == 0 { 0.5f32 } else { -0.125 };
        let mut block = half::f16::from_f32(d).to_le_bytes().to_vec();
        let scales: [u8; 6] = [[0x00; 6], [0xFF; 6], [0x0F, 0xF0, 0x5A, 0xA5, 0x3C, 0xC3]][b % 3];
        block.extend_from_slice(&scales);
        block.extend_from_slice(&[[0x00, 0xFF, 0xF0, 0x0F][b % 4]; 128]);
        block
    });
}
