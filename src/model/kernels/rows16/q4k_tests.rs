use super::super::tests::{check_extreme_blocks, format_tests, Case, SUPER_BLOCK_SHAPES};
use super::*;
use crate::model::kernels::kquant::q4k::tests as q4k_file;
use crate::model::kernels::kquant::q5k::tests as q5k_file;
use candle_core::quantized::GgmlDType;

impl Case for Q4K {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        q4k_file::random_q4k(n, k, seed)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        q4k_file::reference(block, e)
    }
}

impl Case for Q5K {
    const DTYPE: GgmlDType = GgmlDType::Q5K;
    const SHAPES: &'static [(usize, usize, usize)] = SUPER_BLOCK_SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        q5k_file::random_q5k(n, k, seed)
    }

    fn reference(block: &[u8], e: usize) -> f64 {
        q5k_file::reference(block, e)
    }
}

mod q4k {
    use super::*;
    format_tests!(Q4K, 31);
}

mod q5k {
    use super::*;
    format_tests!(Q5K, 37);
}

#[test]
fn memory_is_the_unpacked_blocks() {
    let w = Q4KRows16::from_bytes(&vec![0u8; 16 * 2 * 144], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 148);
    let w = Q5KRows16::from_bytes(&vec![0u8; 16 * 2 * 176], 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 180);
}

#[test]
fn every_fifth_bit_reaches_its_value() {
    // One Q5_K row: d = 1, dmin = 0, every scale 1, nibbles 0; the high bits select, per
    // sub-block s, values whose index i within it has bit s set in qh[i] = i·37 mod 256.
    let mut block = vec![0u8; 176];
    block[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    for s in 0..4 {
        block[4 + s] = 1; // scales 0..4 (mins 0)
        block[12 + s] = 1; // scales 4..8 (low bits)
    }
    for i in 0..32 {
        block[16 + i] = (i * 37 % 256) as u8;
    }
    let w = Q5KRows16::from_bytes(&block, 1, 256).expect("layout");
    let mut row = [0f32; 256];
    w.dequantize_row(0, &mut row);
    for (e, v) in row.iter().enumerate() {
        let (s, i) = (e / 32, e % 32);
        let want = if (i * 37 % 256) >> s & 1 == 1 {
            16.0
        } else {
            0.0
        };
        assert_eq!(*v, want, "value {e}");
    }
}

/// A K-quant super-block with mins (`bytes` long: Q4_K 144, Q5_K 176) whose every scale and
/// min is the largest (63) and whose value bytes are all `fill` (0xFF: every value 15, Q5_K
/// 31), with `d` of either sign.
fn extreme_with_mins(bytes: usize, b: usize) -> Vec<u8> {
    let mut block = f16::from_f32(if b.is_multiple_of(2) { 1.0 } else { -2.5 })
        .to_le_bytes()
        .to_vec();
    block.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
    block.extend_from_slice(&[if b % 4 == 3 { 0xAA } else { 0xFF }; 12]);
    block.resize(bytes, [0xFF, 0x00, 0xF0, 0xFF][b % 4]);
    block
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // The largest values and scales against ±127 activations of one sign and of both: the
    // largest sums each path forms (the AVX2 kernels add steps in 16 bits).
    check_extreme_blocks::<Q4K>(|b| extreme_with_mins(144, b));
    check_extreme_blocks::<Q5K>(|b| extreme_with_mins(176, b));
}
