//! Checks shared by the three K-quant formats.

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use half::f16;

use super::super::panel::tests::lcg;
use super::super::panel::PANEL;
use super::q8k::Q8KPanels;
use super::{KQuantMatrix, SuperBlock, QK_K};
use crate::model::kernels::{isa, Isa};

/// Random file bytes of a `[n, k]` matrix.
pub(crate) type Generator = fn(usize, usize, &mut u64) -> Vec<u8>;

pub(crate) fn random_byte(seed: &mut u64) -> u8 {
    ((lcg(seed) + 1.0) * 127.99) as u8
}

/// A finite f16 in (0, scale], little-endian.
pub(crate) fn random_f16(seed: &mut u64, scale: f32) -> [u8; 2] {
    f16::from_f32((lcg(seed).abs() + 0.01) * scale).to_le_bytes()
}

/// Shapes with rows not a multiple of the panel, n not a multiple of 8 or of the driver's
/// 128-row cache block, and one to nine super-blocks per row.
const SHAPES: [(usize, usize, usize); 6] = [
    (1, 5, 256),
    (7, 9, 512),
    (8, 3, 2304),
    (9, 130, 256),
    (17, 33, 512),
    (2, 1, 2304),
];

/// The matmul of random weights against a naive f64 reference (weights from the file bytes by
/// the GGUF definition, `reference(super_block_bytes, e)`, times the dequantized Q8_K
/// activations), and every SIMD path this CPU has against the portable one, bit for bit.
pub(crate) fn check_matmul<B: SuperBlock>(generate: Generator, reference: fn(&[u8], usize) -> f64) {
    let mut seed = 17;
    for (m, n, k) in SHAPES {
        let bytes = generate(n, k, &mut seed);
        let w = KQuantMatrix::<B>::from_bytes(&bytes, n, k).expect("well-formed");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let got = w.matmul_with(&x, m, Isa::Portable);
        let a = Q8KPanels::quantize(&x, m, k);
        let nb = k / QK_K;
        for row in 0..m {
            let (p, r) = (a.panel(row / PANEL), row % PANEL);
            for j in 0..n {
                let (mut want, mut size) = (0f64, 0f64);
                for b in 0..nb {
                    let blk = &bytes[(j * nb + b) * B::FILE_BYTES..][..B::FILE_BYTES];
                    let i = b * PANEL + r;
                    for e in 0..QK_K {
                        let term = reference(blk, e) * (p.d[i] as f64 * p.qs[i][e] as f64);
                        want += term;
                        size += term.abs();
                    }
                }
                let g = got[row * n + j] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * size + 1e-30,
                    "({m},{n},{k}) [{row},{j}] {g} vs {want} (size {size})"
                );
            }
        }
        for path in [Isa::Avx2, Isa::Avx512] {
            if isa() >= path {
                let simd = w.matmul_with(&x, m, path);
                let same = simd
                    .iter()
                    .zip(&got)
                    .all(|(s, g)| s.to_bits() == g.to_bits());
                assert!(same, "{path:?} differs from portable on ({m},{n},{k})");
            }
        }
    }
    rows_do_not_depend_on_their_neighbours::<B>(generate);
}

/// A row's outputs are the same whether it is computed alone, in a panel with others, or at
/// another place in its panel.
fn rows_do_not_depend_on_their_neighbours<B: SuperBlock>(generate: Generator) {
    let mut seed = 5;
    let (n, k) = (40, 512);
    let w = KQuantMatrix::<B>::from_bytes(&generate(n, k, &mut seed), n, k).expect("well-formed");
    let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
    let all = w.matmul(&x, 37);
    for r in [0, 5, 16, 36] {
        let one = w.matmul(&x[r * k..(r + 1) * k], 1);
        assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
    }
    let tail = w.matmul(&x[3 * k..], 34);
    assert_eq!(&all[3 * n..], tail.as_slice());
}

/// Dequantized rows equal candle's dequantization bit for bit, for random bytes and for
/// weights written by candle's own quantizer.
pub(crate) fn check_dequantization<B: SuperBlock>(dtype: GgmlDType, generate: Generator) {
    let mut seed = 23;
    let (n, k) = (3, 512);
    let random = generate(n, k, &mut seed);
    let x: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
    let source = Tensor::from_vec(x, (n, k), &Device::Cpu).expect("tensor");
    let quantized = QTensor::quantize(&source, dtype).expect("candle quantizes");
    let written = quantized.data().expect("bytes").into_owned();
    for bytes in [random, written] {
        let w = KQuantMatrix::<B>::from_bytes(&bytes, n, k).expect("well-formed");
        let storage = QStorage::from_data(std::borrow::Cow::Borrowed(&bytes), &Device::Cpu, dtype)
            .expect("storage");
        let q = QTensor::new(storage, (n, k)).expect("qtensor");
        let want = q
            .dequantize(&Device::Cpu)
            .and_then(|t| t.to_vec2::<f32>())
            .expect("dequantized");
        for (j, want) in want.iter().enumerate() {
            let mut row = vec![0f32; k];
            w.dequantize_row(j, &mut row);
            let same = row
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype:?} row {j}");
        }
    }
}

#[test]
fn malformed_shapes_are_refused() {
    use super::q4k::Q4KMatrix;
    let bytes = vec![0u8; 2 * 144];
    assert!(Q4KMatrix::from_bytes(&bytes, 2, 256).is_some());
    assert!(Q4KMatrix::from_bytes(&bytes, 1, 512).is_some());
    assert!(Q4KMatrix::from_bytes(&bytes, 2, 512).is_none());
    assert!(Q4KMatrix::from_bytes(&bytes[..144], 1, 128).is_none());
    assert!(Q4KMatrix::from_bytes(&[], 0, 0).is_none());
}

#[test]
fn memory_stays_close_to_the_file() {
    use super::{q4k::Q4KBlock, q5k::Q5KBlock, q6k::Q6KBlock};
    use std::mem::size_of;
    assert_eq!((size_of::<Q4KBlock>(), Q4KBlock::FILE_BYTES), (148, 144));
    assert_eq!((size_of::<Q5KBlock>(), Q5KBlock::FILE_BYTES), (180, 176));
    assert_eq!((size_of::<Q6KBlock>(), Q6KBlock::FILE_BYTES), (210, 210));
}

#[test]
fn own_matrix_serves_k_quants_whose_rows_are_whole_super_blocks() {
    use crate::model::kernels::own_matrix;
    for (dtype, bytes) in [
        (GgmlDType::Q4K, 144),
        (GgmlDType::Q5K, 176),
        (GgmlDType::Q6K, 210),
    ] {
        let m = own_matrix(dtype, &vec![0u8; 2 * bytes], 1, 512).expect("served");
        assert_eq!(m.map(|m| m.shape()).ok(), Some((1, 512)), "{dtype:?}");
        // Malformed bytes are reported; rows of other lengths stay with candle.
        assert!(matches!(
            own_matrix(dtype, &vec![0u8; bytes], 1, 512),
            Some(Err(_))
        ));
        assert!(own_matrix(dtype, &vec![0u8; bytes], 1, 576).is_none());
        assert!(own_matrix(dtype, &[], 1, 0).is_none());
    }
}
