use super::super::tests::{check_bytes, format_tests, Case};
use super::*;
use crate::model::kernels::panel::tests::lcg;
use crate::model::kernels::panel::BLOCK;
use candle_core::quantized::GgmlDType;

impl Case for Q4_0 {
    const DTYPE: GgmlDType = GgmlDType::Q4_0;
    const SHAPES: &'static [(usize, usize, usize)] = &[
        (1, 1, 32),
        (3, 5, 64),
        (7, 33, 96),
        (21, 17, 576),
        (9, 130, 64),
        (16, 3, 2080),
        (8, 16, 32),
    ];

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
            for _ in 0..16 {
                bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
            }
        }
        bytes
    }

    /// `d·(nibble − 8)`: byte `2 + e mod 16`, its low nibble for `e < 16`.
    fn reference(block: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f64();
        let byte = block[2 + e % 16];
        let nibble = if e < 16 { byte & 0x0F } else { byte >> 4 };
        (nibble as i32 - 8) as f64 * d
    }
}

format_tests!(Q4_0, 13);

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every weight −8 or 7 (the extremes) against ±127 activations.
    let (n, k) = (19, 64);
    let mut bytes = Vec::new();
    for b in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(if b % 2 == 0 { 1.0 } else { -3.5 }).to_le_bytes());
        bytes.extend_from_slice(&[[0x00, 0xF0, 0xFF, 0x0F][b % 4]; 16]);
    }
    let x: Vec<f32> = (0..9 * k)
        .map(|i| if i % 3 == 0 { 100.0 } else { -100.0 })
        .collect();
    check_bytes::<Q4_0>(&bytes, (n, k), &x, 9);
}

#[test]
fn memory_is_the_files_bytes() {
    let (n, k) = (32, 96);
    let w = Q4_0Rows16::from_bytes(&vec![0u8; n * k / BLOCK * BLOCK_BYTES], n, k).expect("layout");
    assert_eq!(w.storage_bytes(), n * k / BLOCK * BLOCK_BYTES);
}
