//! The reader against GGUF images built in memory ([`build_gguf`], also used by other
//! modules' tests): values read back, every truncation an error, bad files named.

use candle_core::Device;

use super::*;

/// Builds a small GGUF image in memory: metadata and F32 tensors.
pub(crate) fn build_gguf(kv: &[(&str, Value)], tensors: &[(&str, Vec<u64>, Vec<f32>)]) -> Vec<u8> {
    let raw: Vec<_> = tensors
        .iter()
        .map(|(name, ne, data)| {
            let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (*name, ne.clone(), 0u32, bytes)
        })
        .collect();
    build_gguf_typed(kv, &raw)
}

/// [`build_gguf`] with each tensor's ggml type id and stored bytes given.
pub(crate) fn build_gguf_typed(
    kv: &[(&str, Value)],
    tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
) -> Vec<u8> {
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(b) => out.push(*b as u8),
            Value::String(s) => put_str(out, s),
            Value::Array(items) => {
                out.extend_from_slice(&type_id(&items[0]).to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for i in items {
                    put_value(out, i);
                }
            }
            other => panic!("test builder does not write {other:?}"),
        }
    }
    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U32(_) => 4,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            _ => unreachable!(),
        }
    }
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        put_str(&mut out, k);
        out.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    for (name, ne, type_id, data) in tensors {
        put_str(&mut out, name);
        out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&type_id.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
    }
    out
}

fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f
}

fn sample() -> Vec<u8> {
    build_gguf(
        &[
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(2)),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            ),
        ],
        &[("w", vec![4, 2], (0..8).map(|i| i as f32).collect())],
    )
}

#[test]
fn reads_metadata_and_tensor_values() {
    let f = write(&sample());
    let g = GgufFile::open(f.path()).unwrap();
    assert_eq!(g.get_str("general.architecture", "").unwrap(), "llama");
    assert_eq!(g.get_u64("llama.block_count", "").unwrap(), 2);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens", "").unwrap(),
        vec!["a", "b"]
    );
    let t = g.qtensor("w", &[2, 4], &Device::Cpu).unwrap();
    let v = t
        .dequantize(&Device::Cpu)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(v, vec![vec![0., 1., 2., 3.], vec![4., 5., 6., 7.]]);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample();
    for cut in 0..bytes.len() - 1 {
        let f = write(&bytes[..cut]);
        let err = GgufFile::open(f.path()).expect_err(&format!("cut at {cut}"));
        let msg = err.to_string();
        assert!(msg.contains(&f.path().display().to_string()), "{msg}");
    }
}

#[test]
fn wrong_magic_and_shape_and_type_are_named() {
    let f = write(b"PK\x03\x04 this is a zip file, not a model");
    let msg = GgufFile::open(f.path()).unwrap_err().to_string();
    assert!(msg.contains("is not a GGUF file"), "{msg}");

    let f = write(&sample());
    let g = GgufFile::open(f.path()).unwrap();
    let msg = g
        .qtensor("w", &[4, 2], &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("tensor 'w' has shape [2, 4], expected [4, 2]"),
        "{msg}"
    );

    // Rewrite the type id of tensor 'w' (the u32 after its dims) to IQ2_XXS (16).
    let mut bytes = sample();
    let mut pattern = b"w".to_vec();
    pattern.extend_from_slice(&2u32.to_le_bytes());
    pattern.extend_from_slice(&4u64.to_le_bytes());
    let pos = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice());
    let pos = pos.expect("tensor entry") + 1 + 4 + 16;
    bytes[pos..pos + 4].copy_from_slice(&16u32.to_le_bytes());
    let f = write(&bytes);
    let msg = GgufFile::open(f.path()).unwrap_err().to_string();
    assert!(msg.contains("tensor 'w' has type IQ2_XXS"), "{msg}");
}

/// An IQ4_NL tensor (ggml type 20) opens with its stored size (18 bytes per block: a file of
/// exactly its blocks is whole, one byte less is truncated) and reads as the Q8_0 tensor of
/// the same values, `d·table[index]`, which candle dequantizes and our kernels multiply.
#[test]
fn iq4_nl_tensors_read_as_q8_0_of_their_values() {
    use super::transcode::IQ4_NL_VALUES;
    use candle_core::quantized::GgmlDType;
    let (n, k) = (3usize, 64usize);
    let mut stored = Vec::new();
    let mut values = Vec::new();
    for b in 0..n * k / 32 {
        let d = half::f16::from_f32(0.01 * (b as f32 + 1.0) * if b % 2 == 0 { 1.0 } else { -1.0 });
        let index = |e: usize| ((e * 5 + b * 3) % 16) as u8;
        stored.extend(d.to_le_bytes());
        stored.extend((0..16).map(|j| index(j) | (index(16 + j) << 4)));
        values.extend((0..32).map(|e| d.to_f32() * IQ4_NL_VALUES[index(e) as usize] as f32));
    }
    assert_eq!(stored.len(), n * k / 32 * 18);
    let image = build_gguf_typed(&[], &[("w", vec![k as u64, n as u64], 20, stored.clone())]);
    let f = write(&image);
    let g = GgufFile::open(f.path()).unwrap();
    let info = g.tensor_info("w", "test").unwrap();
    assert_eq!((info.type_id, info.dtype), (20, GgmlDType::Q8_0));
    assert_eq!(info.size, stored.len() as u64);
    // Our kernels take the stored bytes, in place.
    let (_, read) = g.tensor_stored("w", &[n, k]).unwrap();
    assert_eq!(&read[..], &stored[..]);
    assert_eq!(g.mapped_bytes(info).unwrap().bytes(), &stored[..]);
    let (_, data) = g.tensor_data("w", &[n, k]).unwrap();
    assert_eq!(data.len(), n * k / 32 * 34);
    let got = g
        .qtensor("w", &[n, k], &Device::Cpu)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(got, values);
    // Our Q8_0 kernel on the rewritten bytes: row j of the matrix times a one-hot input gives
    // the value at that column.
    let m = crate::model::kernels::own_matrix(GgmlDType::Q8_0, &data, n, k)
        .unwrap()
        .unwrap();
    let mut row = vec![0f32; k];
    m.dequantize_row(1, &mut row);
    assert_eq!(row, values[k..2 * k]);

    // The image ends with the tensor's bytes padded to 32: cut the last stored byte.
    let cut = image.len() - stored.len().div_ceil(32) * 32 + stored.len() - 1;
    let f = write(&image[..cut]);
    let msg = GgufFile::open(f.path()).unwrap_err().to_string();
    assert!(msg.contains("the data of tensor 'w' (108 bytes)"), "{msg}");
}

/// An IQ4_XS tensor (ggml type 23) opens with its stored size (136 bytes per 256 values),
/// hands our kernels its stored bytes and candle its F32 values; rows that are not whole
/// super-blocks are refused by name.
#[test]
fn iq4_xs_tensors_keep_their_bytes_and_read_as_f32() {
    use crate::model::kernels::kquant::iq4xs::tests::{random_iq4xs, reference};
    use candle_core::quantized::GgmlDType;
    let (n, k) = (2usize, 256usize);
    let stored = random_iq4xs(n, k, &mut 3);
    let image = build_gguf_typed(&[], &[("w", vec![k as u64, n as u64], 23, stored.clone())]);
    let f = write(&image);
    let g = GgufFile::open(f.path()).unwrap();
    let info = g.tensor_info("w", "test").unwrap();
    assert_eq!(
        (info.type_id, info.dtype, info.size),
        (23, GgmlDType::F32, 272)
    );
    assert_eq!(
        (info.block_size(), info.type_name().as_str()),
        (256, "IQ4_XS")
    );
    let (_, read) = g.tensor_stored("w", &[n, k]).unwrap();
    assert_eq!(&read[..], &stored[..]);
    let (_, data) = g.tensor_data("w", &[n, k]).unwrap();
    let values: Vec<f64> = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
        .collect();
    let want: Vec<f64> = (0..n * k)
        .map(|i| reference(&stored[i / 256 * 136..][..136], i % 256))
        .collect();
    assert_eq!(values, want);

    let half_rows = build_gguf_typed(&[], &[("w", vec![128, 2], 23, stored[..136].to_vec())]);
    let f = write(&half_rows);
    let msg = GgufFile::open(f.path()).unwrap_err().to_string();
    assert!(
        msg.contains(
            "tensor 'w' has a row of 128 elements, not a multiple of the IQ4_XS block size 256"
        ),
        "{msg}"
    );
}
