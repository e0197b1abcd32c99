use super::super::tests::{bits, format_tests, Case};
use super::*;
use crate::model::kernels::kquant::q6k::{tests as file, Q6KMatrix};
use crate::model::kernels::panel::tests::lcg;
use crate::model::kernels::Isa;
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
fn every_level_gives_the_bits_of_the_panel_kernel_it_replaced() {
    let mut seed = 43;
    for &(m, n, k) in Q6K::SHAPES {
        let bytes = Q6K::random(n, k, &mut seed);
        let w = Q6KRows16::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let before = Q6KMatrix::from_bytes(&bytes, n, k).expect("layout");
        assert_eq!(
            bits(&before.matmul_with(&x, m, Isa::Portable)),
            bits(&w.matmul_at(&x, m, Isa::Portable)),
            "({m},{n},{k})"
        );
    }
}

#[test]
fn memory_is_the_files_bytes() {
    let w = Q6KRows16::from_bytes(&vec![0u8; 16 * 2 * 210], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 210);
}
