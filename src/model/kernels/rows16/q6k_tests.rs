use super::super::tests::{format_tests, Case};
use super::*;
use crate::model::kernels::kquant::q6k::tests as file;
use candle_core::quantized::GgmlDType;

impl Case for Q6K {
    const DTYPE: GgmlDType = GgmlDType::Q6K;
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
