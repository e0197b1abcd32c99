use super::super::tests::{check_extreme_blocks, format_tests, Case};
use super::*;
use crate::model::kernels::panel::tests::lcg;
use crate::model::kernels::panel::BLOCK;
use candle_core::quantized::GgmlDType;

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 32),
    (3, 5, 64),
    (7, 33, 96),
    (21, 17, 576),
    (9, 130, 64),
    (16, 3, 2080),
    (8, 16, 32),
];

/// Random file blocks: `scales` f16 scales of magnitude up to `0.05` each, then nibbles.
fn random_blocks(n: usize, k: usize, scales: usize, seed: &mut u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n * k / BLOCK {
        for _ in 0..scales {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
        }
        for _ in 0..16 {
            bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
        }
    }
    bytes
}

/// Nibble `e` of a block whose nibbles start at byte `at`: byte `at + e mod 16`, its low
/// nibble for `e < 16`.
fn nibble(block: &[u8], at: usize, e: usize) -> i32 {
    let byte = block[at + e % 16];
    (if e < 16 { byte & 0x0F } else { byte >> 4 }) as i32
}

fn half(block: &[u8], at: usize) -> f64 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f64()
}

impl Case for Q4_0 {
    const DTYPE: GgmlDType = GgmlDType::Q4_0;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        random_blocks(n, k, 1, seed)
    }

    /// `d·(nibble − 8)`.
    fn reference(block: &[u8], e: usize) -> f64 {
        (nibble(block, 2, e) - 8) as f64 * half(block, 0)
    }
}

impl Case for Q4_1 {
    const DTYPE: GgmlDType = GgmlDType::Q4_1;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        random_blocks(n, k, 2, seed)
    }

    /// `d·nibble` (the block's `m` is [`Case::minimum`]).
    fn reference(block: &[u8], e: usize) -> f64 {
        nibble(block, 4, e) as f64 * half(block, 0)
    }

    fn minimum(block: &[u8]) -> f64 {
        half(block, 2)
    }
}

impl Case for Iq4Nl {
    /// candle reads IQ4_NL as the reader gives it: the Q8_0 blocks of the same values.
    const DTYPE: GgmlDType = GgmlDType::Q8_0;
    const SHAPES: &'static [(usize, usize, usize)] = SHAPES;

    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        random_blocks(n, k, 1, seed)
    }

    fn candle_bytes(file: &[u8]) -> Vec<u8> {
        crate::model::gguf::transcode::Transcode::of(20)
            .expect("IQ4_NL is transcoded")
            .apply(file)
    }

    /// `d·table[nibble]`, ggml's `kvalues_iq4nl`.
    fn reference(block: &[u8], e: usize) -> f64 {
        const TABLE: [i32; 16] = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        TABLE[nibble(block, 2, e) as usize] as f64 * half(block, 0)
    }
}

mod q4_0 {
    use super::*;
    format_tests!(Q4_0, 13);
}

mod q4_1 {
    use super::*;
    format_tests!(Q4_1, 29);
}

mod iq4_nl {
    use super::*;
    format_tests!(Iq4Nl, 41);
}

/// The f16 bytes of `v`.
fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every weight −8 or 7 (the extremes) against ±127 activations.
    check_extreme_blocks::<Q4_0>(|b| {
        let mut block = f16_bytes(if b % 2 == 0 { 1.0 } else { -3.5 }).to_vec();
        block.extend_from_slice(&[[0x00, 0xF0, 0xFF, 0x0F][b % 4]; 16]);
        block
    });
}

#[test]
fn extreme_q4_1_blocks_give_the_same_bits_on_every_path() {
    // Nibbles 0 or 15 with minima of both signs against ±127 activations.
    check_extreme_blocks::<Q4_1>(|b| {
        let mut block = f16_bytes(if b % 2 == 0 { 1.0 } else { 3.5 }).to_vec();
        block.extend_from_slice(&f16_bytes([-8.0, 0.0, 2.5][b % 3]));
        block.extend_from_slice(&[[0x00, 0xF0, 0xFF, 0x0F][b % 4]; 16]);
        block
    });
}

#[test]
fn memory_is_the_files_bytes() {
    let (n, k) = (32, 96);
    let blocks = n * k / BLOCK;
    let w = Q4_0Rows16::from_bytes(&vec![0u8; blocks * 18], n, k).expect("layout");
    assert_eq!(w.storage_bytes(), blocks * 18);
    let w = Q4_1Rows16::from_bytes(&vec![0u8; blocks * 20], n, k).expect("layout");
    assert_eq!(w.storage_bytes(), blocks * 20);
}

#[test]
fn q4_1_dequantizes_nibble_times_d_plus_m() {
    // d = 0.5, m = −3, nibbles 0..15 then 15..0.
    let mut block = Vec::new();
    block.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
    block.extend_from_slice(&f16::from_f32(-3.0).to_le_bytes());
    block.extend((0..16u8).map(|i| i | (15 - i) << 4));
    let w = Q4_1Rows16::from_bytes(&block, 1, 32).expect("layout");
    let mut row = [0f32; 32];
    w.dequantize_row(0, &mut row);
    let want: Vec<f32> = (0..32)
        .map(|e| if e < 16 { e as f32 } else { (31 - e) as f32 } * 0.5 - 3.0)
        .collect();
    assert_eq!(&row[..], &want[..]);
}

#[test]
fn extreme_iq4_nl_blocks_give_the_same_bits_on_every_path() {
    // Indices 0 (−127) and 15 (113), the table's extremes, against ±127 activations: the
    // AVX2 pairs at their largest, 2·127·127.
    check_extreme_blocks::<Iq4Nl>(|b| {
        let mut block = f16_bytes(if b % 2 == 0 { 1.0 } else { -3.5 }).to_vec();
        block.extend_from_slice(&[[0x00, 0xF0, 0xFF, 0x0F][b % 4]; 16]);
        block
    });
}

/// The IQ4_NL tensors the reader gives as Q8_0 go back to 18 bytes a block and give the bits
/// of the Q8_0 kernel on the same bytes at every level; a Q8_0 tensor with a value outside
/// the table is not taken.
#[test]
fn iq4_nl_from_q8_0_is_the_q8_0_product_in_18_bytes_a_block() {
    use super::super::q8_0::Q8_0Rows16;
    use crate::model::kernels::panel::tests::available_isas;
    let mut seed = 7;
    let (m, n, k) = (13, 35, 96);
    let file = Iq4Nl::random(n, k, &mut seed);
    let q8 = Iq4Nl::candle_bytes(&file);
    let iq4 = Iq4NlRows16::from_q8_0(&q8, n, k).expect("table values only");
    assert_eq!(iq4.storage_bytes(), n.div_ceil(16) * 16 * k / 32 * 18);
    let plain = Q8_0Rows16::from_bytes(&q8, n, k).expect("layout");
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 2.0).collect();
    for isa in available_isas() {
        assert_eq!(
            super::super::tests::bits(&iq4.matmul_at(&x, m, isa)),
            super::super::tests::bits(&plain.matmul_at(&x, m, isa)),
            "{isa:?}"
        );
    }
    let mut other = q8.clone();
    other[2 + 5] = 0; // 0 is not an IQ4_NL value
    assert!(Iq4NlRows16::from_q8_0(&other, n, k).is_none());
    assert!(Iq4NlRows16::from_q8_0(&q8[..q8.len() - 1], n, k).is_none());
}
