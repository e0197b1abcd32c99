use super::super::tests::{check_extreme_blocks, format_tests, Case};
use super::*;
use crate::model::kernels::panel::tests::lcg;
use crate::model::kernels::panel::BLOCK;
use candle_core::quantized::GgmlDType;
use half::f16;

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 32),
    (3, 5, 64),
    (7, 33, 96),
    (21, 17, 640),
    (9, 131, 64),
    (16, 3, 2080),
    (8, 16, 32),
    (10, 129, 576),
];

impl Case for Q8_0 {
    const DTYPE: GgmlDType = GgmlDType::Q8_0;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / BLOCK {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.01).to_le_bytes());
            for e in 0..32 {
                // Include −128, which ggml's quantizer never writes but a file may hold.
                let v = if b % 7 == 0 && e == 3 {
                    -128
                } else {
                    (lcg(seed) * 127.9) as i8
                };
                bytes.push(v as u8);
            }
        }
        bytes
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        f16::from_le_bytes([block[0], block[1]]).to_f64() * (block[2 + e] as i8) as f64
    }
}

impl Case for Q5_0 {
    const DTYPE: GgmlDType = GgmlDType::Q5_0;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
            for _ in 0..20 {
                bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
            }
        }
        bytes
    }

    /// `(nibble | high bit << 4) − 16`, times d.
    fn reference(block: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f64();
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        let nib = if e < 16 {
            block[6 + e] & 15
        } else {
            block[6 + e - 16] >> 4
        };
        d * ((nib as i32 | (((qh >> e) & 1) as i32) << 4) - 16) as f64
    }
}

impl Case for Q5_1 {
    const DTYPE: GgmlDType = GgmlDType::Q5_1;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.8).to_le_bytes());
            for _ in 0..20 {
                bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
            }
        }
        bytes
    }

    /// `(nibble | high bit << 4)·d` (the block's `m` is [`Case::minimum`]).
    fn reference(block: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f64();
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        let nib = if e < 16 {
            block[8 + e] & 15
        } else {
            block[8 + e - 16] >> 4
        };
        d * (nib as u32 | ((qh >> e) & 1) << 4) as f64
    }

    fn minimum(block: &[u8]) -> f64 {
        f16::from_le_bytes([block[2], block[3]]).to_f64()
    }
}

mod q8_0 {
    use super::*;
    format_tests!(Q8_0, 19);
}

mod q5_1 {
    use super::*;
    format_tests!(Q5_1, 23);
}

mod q5_0 {
    use super::*;
    format_tests!(Q5_0, 11);
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every weight −128 or 127 against ±127 activations: the largest products each path forms.
    check_extreme_blocks::<Q8_0>(|b| {
        let d = if b % 2 == 0 { 1.0 } else { -3.5 };
        let mut block = f16::from_f32(d).to_le_bytes().to_vec();
        block.extend_from_slice(&[[0x80, 0x7F, 0x80, 0x00][b % 4]; 32]);
        block
    });
}

#[test]
fn five_bit_extreme_blocks_give_the_same_bits_on_every_path() {
    // Every value at the top (all bits set: Q5_0 15, Q5_1 31) or the bottom (none: −16, 0) or
    // mixed, against ±127 activations of one sign and of both: the largest sums the AVX2
    // kernel adds in 16 bits (four runs of unsigned 0..31).
    let fill = |b: usize| [0xFF, 0x00, 0xFF, 0x5A][b % 4];
    check_extreme_blocks::<Q5_0>(|b| {
        let d = if b % 2 == 0 { 1.0 } else { -3.5 };
        let mut block = f16::from_f32(d).to_le_bytes().to_vec();
        block.extend_from_slice(&[fill(b); 20]);
        block
    });
    check_extreme_blocks::<Q5_1>(|b| {
        let d = if b % 2 == 0 { 1.0 } else { -3.5 };
        let mut block = f16::from_f32(d).to_le_bytes().to_vec();
        block.extend_from_slice(&f16::from_f32(-0.75).to_le_bytes());
        block.extend_from_slice(&[fill(b); 20]);
        block
    });
}

#[test]
fn q5_1_decodes_the_extremes_and_holds_36_bytes_per_block() {
    // qh all ones, nibbles 0xF → 31·d + m; qh zero, nibbles 0 → m.
    let mut b = vec![0u8; Q5_1_BLOCK_BYTES];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(-2.0).to_le_bytes());
    b[4..8].copy_from_slice(&0x0000_FFFFu32.to_le_bytes());
    for v in &mut b[8..] {
        *v = 0x0F;
    }
    let w = Q5_1Rows16::from_bytes(&b, 1, 32).expect("layout");
    let mut row = [0f32; 32];
    w.dequantize_row(0, &mut row);
    assert_eq!(
        (&row[..16], &row[16..]),
        (&[13.5f32; 16][..], &[-2f32; 16][..])
    );
    assert_eq!(w.storage_bytes(), 16 * 36);
}

#[test]
fn decoding_covers_the_extremes_and_memory_is_34_bytes_per_block() {
    // qh all ones, nibbles 0xF → +15; qh zero, nibbles 0 → −16.
    let mut b = vec![0u8; Q5_0_BLOCK_BYTES];
    b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    b[2..6].copy_from_slice(&0x0000_FFFFu32.to_le_bytes());
    for v in &mut b[6..] {
        *v = 0x0F;
    }
    let w = Q5_0Rows16::from_bytes(&b, 1, 32).expect("layout");
    let mut row = [0f32; 32];
    w.dequantize_row(0, &mut row);
    assert_eq!(
        (&row[..16], &row[16..]),
        (&[15f32; 16][..], &[-16f32; 16][..])
    );
    // One row: a group of 16, 34 bytes per block.
    assert_eq!(w.storage_bytes(), 16 * Q8_0_BLOCK_BYTES);
    let mut q8 = vec![0u8; Q8_0_BLOCK_BYTES];
    q8[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    q8[2] = 0x80;
    q8[33] = 0x7F;
    let w = Q8_0Rows16::from_bytes(&q8, 1, 32).expect("layout");
    w.dequantize_row(0, &mut row);
    assert_eq!((row[0], row[31]), (-128.0, 127.0));
}
