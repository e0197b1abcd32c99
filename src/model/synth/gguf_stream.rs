//! A streaming GGUF v3 writer: the whole header (metadata, every tensor's name, dimensions,
//! type and offset) is computed from the tensors' shapes and types before any data exists,
//! then the data is produced and written one tensor at a time. Candle's writer needs every
//! tensor in memory at once, which an 8B model in f32 (32 GB) cannot afford.
//!
//! Layout (llama.cpp's `gguf.h`): magic `GGUF`, version, tensor count, metadata count (u64),
//! the key/value pairs, the tensor directory (dimensions innermost first, offsets relative to
//! the data section), padding to the alignment, then each tensor's bytes padded likewise. The
//! file is written under a temporary name and renamed into place at the end, so a failure
//! leaves no partial model.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::SynthError;
use crate::model::gguf::transcode::StoredType;
use crate::model::gguf::Value;

/// Data alignment (the GGUF default; written as `general.alignment` too).
pub const ALIGNMENT: u64 = 32;

/// A tensor to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    /// Dimensions outermost first.
    pub shape: Vec<usize>,
    pub dtype: StoredType,
}

impl TensorEntry {
    /// Bytes of the tensor's data.
    pub fn size(&self) -> u64 {
        self.dtype.stored_bytes(self.shape.iter().product())
    }
}

/// The header bytes and where each tensor's data goes.
#[derive(Debug, Clone)]
pub struct Layout {
    header: Vec<u8>,
    /// (tensor, offset from the start of the data section).
    tensors: Vec<(TensorEntry, u64)>,
}

/// GGUF's metadata value type id.
fn value_type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, key: &str, v: &Value) -> Result<(), SynthError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            // An empty array keeps a type of its own in GGUF; ppl's reader does not keep it,
            // so it is written as an array of u32.
            let elem = items.first().map_or(4, value_type_id);
            if elem == 9 || items.iter().any(|i| value_type_id(i) != elem) {
                return Err(SynthError::Unsupported(format!(
                    "metadata key '{key}' is a nested or mixed-type array, which GGUF cannot store"
                )));
            }
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, key, item)?;
            }
        }
    }
    Ok(())
}

impl Layout {
    /// Computes the header for `metadata` (written in this order) and `tensors` (their data
    /// follows in this order).
    pub fn new(
        metadata: &[(String, Value)],
        tensors: Vec<TensorEntry>,
    ) -> Result<Self, SynthError> {
        let mut h = b"GGUF".to_vec();
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_str(&mut h, key);
            h.extend_from_slice(&value_type_id(value).to_le_bytes());
            put_value(&mut h, key, value)?;
        }
        let mut placed = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let cols = t.shape.last().copied().unwrap_or(0);
            if !cols.is_multiple_of(t.dtype.block_size()) {
                return Err(SynthError::InvalidShape(format!(
                    "tensor '{}' has rows of {cols} values, not a multiple of the {:?} block ({})",
                    t.name,
                    t.dtype,
                    t.dtype.block_size()
                )));
            }
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                h.extend_from_slice(&(d as u64).to_le_bytes());
            }
            h.extend_from_slice(&t.dtype.type_id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            let next = offset + t.size().div_ceil(ALIGNMENT) * ALIGNMENT;
            placed.push((t, offset));
            offset = next;
        }
        h.resize(
            (h.len() as u64).div_ceil(ALIGNMENT) as usize * ALIGNMENT as usize,
            0,
        );
        Ok(Self {
            header: h,
            tensors: placed,
        })
    }

    /// Bytes of the header, padding included (where the data section starts).
    pub fn header_len(&self) -> u64 {
        self.header.len() as u64
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        self.header_len()
            + self
                .tensors
                .iter()
                .map(|(t, _)| t.size().div_ceil(ALIGNMENT) * ALIGNMENT)
                .sum::<u64>()
    }

    /// The tensors and their offsets in the data section.
    pub fn tensors(&self) -> &[(TensorEntry, u64)] {
        &self.tensors
    }

    /// Writes the file: the header, then each tensor's bytes as `produce(index, tensor, sink)`
    /// hands them to `sink` (exactly [`TensorEntry::size`] bytes each, checked).
    pub fn write<P>(&self, out: &Path, mut produce: P) -> Result<u64, SynthError>
    where
        P: FnMut(
            usize,
            &TensorEntry,
            &mut dyn FnMut(&[u8]) -> Result<(), SynthError>,
        ) -> Result<(), SynthError>,
    {
        let tmp = temp_path(out);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SynthError::Io {
                path: path.clone(),
                source,
            }
        };
        let result = (|| -> Result<u64, SynthError> {
            let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
            w.write_all(&self.header).map_err(io(&tmp))?;
            let mut position = self.header_len();
            for (index, (t, offset)) in self.tensors.iter().enumerate() {
                debug_assert_eq!(position, self.header_len() + offset);
                let mut written = 0u64;
                let mut sink = |bytes: &[u8]| -> Result<(), SynthError> {
                    written += bytes.len() as u64;
                    w.write_all(bytes).map_err(io(&tmp))
                };
                produce(index, t, &mut sink)?;
                if written != t.size() {
                    return Err(SynthError::Unsupported(format!(
                        "tensor '{}': {written} bytes produced, {} expected (a bug in ppl)",
                        t.name,
                        t.size()
                    )));
                }
                let padded = written.div_ceil(ALIGNMENT) * ALIGNMENT;
                w.write_all(&vec![0u8; (padded - written) as usize])
                    .map_err(io(&tmp))?;
                position += padded;
            }
            let file = w.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
            file.sync_all().map_err(io(&tmp))?;
            std::fs::rename(&tmp, out).map_err(io(out))?;
            Ok(position)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// `OUT.tmp-PID` beside `out` (same filesystem, so the final rename is atomic).
pub(crate) fn temp_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    out.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{gguf_file, GgmlDType};
    use candle_core::Device;

    fn entries() -> Vec<TensorEntry> {
        let e = |name: &str, shape: &[usize], dtype: GgmlDType| TensorEntry {
            name: name.into(),
            shape: shape.to_vec(),
            dtype: dtype.into(),
        };
        vec![
            e("a.weight", &[3], GgmlDType::F32),
            e("b.weight", &[5, 256], GgmlDType::Q4K),
            e("c.weight", &[2, 64], GgmlDType::Q8_0),
            e("d.weight", &[7, 32], GgmlDType::BF16),
            e("e.weight", &[1, 96], GgmlDType::F16),
        ]
    }

    fn metadata() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("general.alignment".into(), Value::U32(ALIGNMENT as u32)),
            ("x.f".into(), Value::F32(0.5)),
            ("x.i".into(), Value::I32(-3)),
            ("x.u64".into(), Value::U64(1 << 40)),
            ("x.flag".into(), Value::Bool(true)),
            (
                "x.tokens".into(),
                Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
            ),
            (
                "x.scores".into(),
                Value::Array(vec![Value::F32(1.0), Value::F32(-2.0)]),
            ),
        ]
    }

    /// The bytes tensor `i` is filled with (distinct per tensor, so misplaced data shows).
    /// Distinct bytes per tensor, kept below 0x40 so every f32/f16 they form (and every
    /// block scale) is finite: the reader refuses NaN and infinite weights.
    fn fill(i: usize, size: u64) -> Vec<u8> {
        (0..size)
            .map(|j| (j as usize * 7 + i * 31) as u8 & 0x3f)
            .collect()
    }

    #[test]
    fn header_reads_back_with_candle_and_ppl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let layout = Layout::new(&metadata(), entries()).unwrap();
        let len = layout
            .write(&path, |i, t, sink| sink(&fill(i, t.size())))
            .unwrap();
        assert_eq!(len, std::fs::metadata(&path).unwrap().len());
        assert_eq!(len, layout.file_len());
        assert!(!temp_path(&path).exists());

        // candle's reader: same directory, offsets, metadata.
        let mut f = std::fs::File::open(&path).unwrap();
        let c = gguf_file::Content::read(&mut f).unwrap();
        assert_eq!(c.tensor_data_offset, layout.header_len());
        for (t, offset) in layout.tensors() {
            let info = &c.tensor_infos[&t.name];
            assert_eq!(info.offset, *offset, "{}", t.name);
            assert_eq!(t.dtype, info.ggml_dtype);
            assert_eq!(info.shape.dims(), t.shape.as_slice());
        }
        assert_eq!(
            c.metadata["general.architecture"].to_string().unwrap(),
            "llama"
        );
        assert_eq!(c.metadata["x.i"].to_i32().unwrap(), -3);
        assert_eq!(c.metadata["x.u64"].to_u64().unwrap(), 1 << 40);
        assert_eq!(c.metadata["x.tokens"].to_vec().unwrap().len(), 2);
        // The data candle reads for a tensor is what was written for it.
        let q = c.tensor(&mut f, "c.weight", &Device::Cpu).unwrap();
        assert_eq!(q.data().unwrap().as_ref(), fill(2, 4 * 34).as_slice()); // 4 Q8_0 blocks

        // ppl's reader: the same, and the metadata values exactly.
        let g = crate::model::GgufFile::open(&path).unwrap();
        assert_eq!(g.version, 3);
        for (k, v) in metadata() {
            assert_eq!(g.metadata.get(&k), Some(&v), "{k}");
        }
        for (i, (t, _)) in layout.tensors().iter().enumerate() {
            let (_, bytes) = g.tensor_data(&t.name, &t.shape).unwrap();
            assert_eq!(bytes.as_ref(), fill(i, t.size()).as_slice(), "{}", t.name);
        }
    }

    #[test]
    fn a_wrong_byte_count_or_block_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let layout = Layout::new(&metadata(), entries()).unwrap();
        let err = layout
            .write(&path, |i, t, sink| {
                sink(&fill(i, t.size() - (i == 3) as u64))
            })
            .unwrap_err();
        assert!(err.to_string().contains("d.weight"), "{err}");
        assert!(!path.exists() && !temp_path(&path).exists());
        let bad = vec![TensorEntry {
            name: "q".into(),
            shape: vec![2, 48],
            dtype: GgmlDType::Q8_0.into(),
        }];
        let err = Layout::new(&[], bad).unwrap_err().to_string();
        assert!(err.contains("rows of 48 values"), "{err}");
    }
}
