use super::super::tests::{check_extreme_blocks, format_tests, Case, SUPER_BLOCK_SHAPES};
use super::*;
use crate::model::kernels::kquant::q6k::tests as file;
use candle_core::quantized::GgmlDType;

impl Case for Q6K {
    const DTYPE: GgmlDType = GgmlDType::Q6K;
    const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        file::random_q6k(n, k, seed)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        file::reference(block, e)
    }
}

format_tests!(Q6K, 37);

#[test]
fn memory_is_the_files_bytes() {
    let w = Q6KRows16::from_bytes(&vec![0u8; 16 * 2 * 210], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 210);
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every value 31 (all bits set) or −32 (none), scales of both extremes (127 and −128),
    // against ±127 activations of one sign and of both: the largest sums each path forms (the
    // AVX2 kernel adds two steps in 16 bits, and its −32 offsets against the scales apart).
    check_extreme_blocks::<Q6K>(|b| {
        let mut block = vec![[0xFF, 0x00, 0xFF, 0x55][b % 4]; 192];
        block.extend((0..16).map(|j| if (j + b) % 3 == 0 { 0x80 } else { 0x7F }));
        let d = if b % 2 == 0 { 1.0 } else { -0.25 };
        block.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        block
    });
}
