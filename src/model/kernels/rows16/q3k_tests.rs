use super::super::tests::{check_extreme_blocks, format_tests, Case, SUPER_BLOCK_SHAPES};
use super::super::GROUP;
use super::*;
use crate::model::kernels::kquant::q3k::tests as file;
use candle_core::quantized::GgmlDType;

impl Case for Q3K {
    const DTYPE: GgmlDType = GgmlDType::Q3K;
    const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        file::random_q3k(n, k, seed)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        file::reference(block, e)
    }
}

format_tests!(Q3K, 41);

#[test]
fn memory_is_the_files_bytes_and_the_unpacked_scales() {
    let w = Q3KRows16::from_bytes(&vec![0u8; 16 * 2 * 110], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 114);
}

#[test]
fn every_value_lands_where_the_layout_says() {
    // One row of one super-block whose value e is e mod 8 (two low bits, high bit), and a
    // scale byte pattern: the repacked lane reads back e mod 8 everywhere, in every lane.
    let mut file = vec![0u8; 110];
    for e in 0..256 {
        let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
        let u = (e % 8) as u8;
        file[32 + 32 * n + l] |= (u & 3) << (2 * j);
        file[l] |= ((u >> 2) & 1) << (4 * n + j);
    }
    let mut group = vec![0u8; Q3KValues::GROUP_BLOCK_BYTES];
    for lane in 0..GROUP {
        Q3KValues::pack(&file, &mut group, lane);
    }
    for lane in 0..GROUP {
        for e in 0..256 {
            assert_eq!(
                Q3KValues::value(&group, lane, e),
                (e % 8) as u8,
                "lane {lane} e {e}"
            );
        }
    }
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every value 3 (all bits set) or −4 (none), scales of both extremes (31 and −32),
    // against ±127 activations of one sign and of both.
    check_extreme_blocks::<Q3K>(|b| {
        let mut block = vec![[0xFF, 0x00, 0xFF, 0x55][b % 4]; 96];
        block.extend((0..12).map(|j| if (j + b) % 3 == 0 { 0x00 } else { 0xFF }));
        let d = if b % 2 == 0 { 1.0 } else { -0.25 };
        block.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        block
    });
}
