//! Checks shared by the three K-quant formats' definitions.

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use half::f16;

use super::super::panel::tests::lcg;
use super::{SuperBlock, QK_K};

/// Random file bytes of a `[n, k]` matrix.
pub(crate) type Generator = fn(usize, usize, &mut u64) -> Vec<u8>;

pub(crate) fn random_byte(seed: &mut u64) -> u8 {
    ((lcg(seed) + 1.0) * 127.99) as u8
}

/// A finite f16 in (0, scale], little-endian.
pub(crate) fn random_f16(seed: &mut u64, scale: f32) -> [u8; 2] {
    f16::from_f32((lcg(seed).abs() + 0.01) * scale).to_le_bytes()
}

/// Random super-blocks of `bytes` bytes each for a `[n, k]` matrix: finite positive scales
/// `d` and `dmin`, then random packed scales, mins and values (Q4_K and Q5_K).
pub(crate) fn random_with_mins(bytes: usize, (n, k): (usize, usize), seed: &mut u64) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n * k / QK_K {
        out.extend_from_slice(&random_f16(seed, 0.01));
        out.extend_from_slice(&random_f16(seed, 0.002));
        for _ in 4..bytes {
            out.push(random_byte(seed));
        }
    }
    out
}

/// By the GGUF definition, in f64: `d · scale` and `dmin · min` of sub-block `s` (of 32
/// values) of a Q4_K or Q5_K super-block (its `d`, `dmin`, then twelve bytes of 6-bit scales
/// and mins).
pub(crate) fn reference_scale_and_min(blk: &[u8], s: usize) -> (f64, f64) {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
    let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f64();
    let sc = &blk[4..16];
    let (scale, min) = if s < 4 {
        (sc[s] & 63, sc[s + 4] & 63)
    } else {
        (
            (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4),
            (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4),
        )
    };
    (d * scale as f64, dmin * min as f64)
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
        let storage = QStorage::from_data(std::borrow::Cow::Borrowed(&bytes), &Device::Cpu, dtype)
            .expect("storage");
        let q = QTensor::new(storage, (n, k)).expect("qtensor");
        let want = q
            .dequantize(&Device::Cpu)
            .and_then(|t| t.to_vec2::<f32>())
            .expect("dequantized");
        for (j, want) in want.iter().enumerate() {
            let mut row = vec![0f32; k];
            let blocks = bytes[j * k / QK_K * B::FILE_BYTES..].chunks_exact(B::FILE_BYTES);
            for (file, out) in blocks.zip(row.chunks_exact_mut(QK_K)) {
                B::decode(file).dequantize(out);
            }
            let same = row
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype:?} row {j}");
        }
    }
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
