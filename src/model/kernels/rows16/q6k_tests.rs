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

#[cfg(target_arch = "x86_64")]
#[test]
fn staged_scale_digits_are_every_i8_in_balanced_base_seven() {
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
        println!("SKIPPED: AVX-512 not in this CPU");
        return;
    }
    for first in (0..=255u8).step_by(16) {
        let bytes: [u8; 16] = std::array::from_fn(|i| first + i as u8);
        // SAFETY: AVX-512 F/BW detected above; sixteen bytes.
        let lanes = unsafe { super::x86::scale_digits(bytes.as_ptr()) }.map(|d| {
            let mut lanes = [0i32; 16];
            // SAFETY: sixteen i32 lanes into sixteen i32.
            unsafe { std::arch::x86_64::_mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, d) };
            lanes
        });
        for (j, &byte) in bytes.iter().enumerate() {
            let scale = byte as i8 as i32;
            let [d0, d1, d2] = lanes.map(|lane| {
                let (low, high) = (lane[j] as i16 as i32, lane[j] >> 16);
                assert_eq!(low, high, "scale {scale}: the digit in both halves");
                assert!((-3..=3).contains(&low), "scale {scale}: digit {low}");
                low
            });
            assert_eq!(d0 + 7 * d1 + 49 * d2, scale, "digits {d0} {d1} {d2}");
        }
    }
}
