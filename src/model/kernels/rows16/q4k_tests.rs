use super::super::tests::{check_against_panel_kernel, format_tests, Case};
use super::*;
use crate::model::kernels::kquant::q4k::{tests as file, Q4KBlock};
use candle_core::quantized::GgmlDType;

impl Case for Q4K {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    const SHAPES: &'static [(usize, usize, usize)] = &[
        (1, 5, 256),
        (7, 9, 512),
        (8, 3, 2304),
        (9, 130, 256),
        (17, 33, 512),
        (2, 1, 2304),
        (16, 16, 768),
    ];

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        file::random_q4k(n, k, seed)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        file::reference(block, e)
    }
}

format_tests!(Q4K, 31);

#[test]
fn every_level_gives_the_bits_of_the_panel_kernel_it_replaced() {
    check_against_panel_kernel::<Q4K, Q4KBlock>(41);
}

#[test]
fn memory_is_the_unpacked_blocks() {
    let w = Q4KRows16::from_bytes(&vec![0u8; 16 * 2 * 144], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 148);
}
