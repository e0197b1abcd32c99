//! Parsing a GGUF file's header (versions 2 and 3) from the map: a bounds-checked cursor, the
//! metadata and the tensor directory, with every inconsistency a [`GgufError`].

use std::collections::BTreeMap;
use std::path::Path;

use memmap2::Mmap;

use super::transcode::Transcode;
use super::{ggml_dtype, ggml_type_name, GgufError, GgufFile, Result, TensorInfo, Value};

/// Bounds-checked little-endian cursor over the mapped bytes.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                len: self.bytes.len() as u64,
            }),
        }
    }
    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?
                .try_into()
                .expect("take(4) yields 4 bytes"),
        ))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?
                .try_into()
                .expect("take(8) yields 8 bytes"),
        ))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        let remaining = (self.bytes.len() - self.pos) as u64;
        if len > remaining {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: format!("{} (string of {len} bytes)", what()),
                offset: self.pos as u64,
                len: self.bytes.len() as u64,
            });
        }
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::Corrupt {
            path: self.path.to_path_buf(),
            detail: format!("{} is not valid UTF-8", what()),
        })
    }

    fn value(&mut self, type_id: u32, what: &dyn Fn() -> String, depth: usize) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(u16::from_le_bytes(
                self.take(2, what)?
                    .try_into()
                    .expect("take(2) yields 2 bytes"),
            )),
            3 => Value::I16(i16::from_le_bytes(
                self.take(2, what)?
                    .try_into()
                    .expect("take(2) yields 2 bytes"),
            )),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => Value::Bool(self.u8(what)? != 0),
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 0 {
                    return Err(GgufError::Corrupt {
                        path: self.path.to_path_buf(),
                        detail: format!("{} is an array nested deeper than ppl reads", what()),
                    });
                }
                let elem_type = self.u32(what)?;
                let len = self.u64(what)?;
                // Every element takes at least one byte: a length beyond the rest of the
                // file is corruption, not a reason to allocate.
                let remaining = (self.bytes.len() - self.pos) as u64;
                if len > remaining {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("{} (array of {len} elements)", what()),
                        offset: self.pos as u64,
                        len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_type, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            other => {
                return Err(GgufError::Corrupt {
                    path: self.path.to_path_buf(),
                    detail: format!("{} has unknown metadata value type {other}", what()),
                })
            }
        })
    }
}

const MAX_TENSORS: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;

impl GgufFile {
    /// Maps and parses the GGUF file `file`, opened from `path` (a model path is opened by
    /// [`GgufFile::open`], which also reads checkpoint directories).
    pub(in crate::model) fn map_gguf(path: &Path, file: &std::fs::File) -> Result<Self> {
        // SAFETY: the map is read-only; ppl never writes the file while it is mapped. A file
        // changed by another process under us is outside what any mmap-based loader can guard.
        let mmap = unsafe { Mmap::map(file) }.map_err(|source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, mmap)
    }

    fn parse(path: &Path, mmap: Mmap) -> Result<Self> {
        let bytes: &[u8] = &mmap;
        let mut cur = Cursor {
            path,
            bytes,
            pos: 0,
        };
        if bytes.len() < 4 {
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: "the GGUF magic".into(),
                offset: 0,
                len: bytes.len() as u64,
            });
        }
        let magic: [u8; 4] = bytes[..4].try_into().expect("length checked above");
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
                magic,
            });
        }
        cur.pos = 4;
        let version = cur.u32(&|| "the GGUF version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = cur.u64(&|| "the tensor count".into())?;
        let n_kv = cur.u64(&|| "the metadata count".into())?;
        if n_tensors > MAX_TENSORS || n_kv > bytes.len() as u64 {
            return Err(GgufError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("implausible header: {n_tensors} tensors, {n_kv} metadata keys"),
            });
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = cur.string(&|| format!("metadata key #{i}"))?;
            let what = || format!("the value of metadata key '{key}'");
            let type_id = cur.u32(&what)?;
            let value = cur.value(type_id, &what, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey {
                    path: path.to_path_buf(),
                    key,
                });
            }
            metadata.insert(key, value);
        }
        let mut infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = cur.string(&|| format!("the name of tensor #{i}"))?;
            let what = || format!("the directory entry of tensor '{name}'");
            let n_dims = cur.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("tensor '{name}' has {n_dims} dimensions (1..=4 allowed)"),
                });
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(cur.u64(&what)?);
            }
            let type_id = cur.u32(&what)?;
            let offset = cur.u64(&what)?;
            infos.push((name, ne, type_id, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::Corrupt {
                        path: path.to_path_buf(),
                        detail: format!("general.alignment is {v:?}, not a power of two"),
                    })
                }
            },
        };
        let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let mut tensors = BTreeMap::new();
        for (name, ne, type_id, rel_offset) in infos {
            let transcode = Transcode::of(type_id);
            let Some(dtype) = ggml_dtype(type_id).or(transcode.map(Transcode::computed_as)) else {
                return Err(GgufError::UnsupportedType {
                    path: path.to_path_buf(),
                    tensor: name,
                    type_id,
                    type_name: ggml_type_name(type_id),
                });
            };
            let corrupt = |detail: String| GgufError::Corrupt {
                path: path.to_path_buf(),
                detail,
            };
            let mut elems: u64 = 1;
            for &d in &ne {
                elems = elems.checked_mul(d).ok_or_else(|| {
                    corrupt(format!("tensor '{name}' has dims {ne:?} that overflow"))
                })?;
            }
            // A rewritten type's rows hold whole stored blocks (IQ4_XS: 256 values), not
            // merely whole blocks of the type it is computed as.
            let block = transcode.map_or(dtype.block_size(), Transcode::block_size) as u64;
            if ne[0] % block != 0 {
                return Err(corrupt(format!(
                    "tensor '{name}' has a row of {} elements, not a multiple of the {} block size {block}",
                    ne[0],
                    ggml_type_name(type_id)
                )));
            }
            let stored_block_bytes = match transcode {
                Some(t) => t.stored_block_bytes(),
                None => dtype.type_size(),
            };
            let size = elems / block * stored_block_bytes as u64;
            let offset = data_start
                .checked_add(rel_offset)
                .ok_or_else(|| corrupt(format!("tensor '{name}' has offset {rel_offset}")))?;
            if offset % alignment != 0 {
                return Err(corrupt(format!(
                    "tensor '{name}' data offset {rel_offset} is not aligned to {alignment}"
                )));
            }
            match offset.checked_add(size) {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::Truncated {
                        path: path.to_path_buf(),
                        what: format!("the data of tensor '{name}' ({size} bytes)"),
                        offset,
                        len: file_len,
                    })
                }
            }
            let shape = ne.iter().rev().map(|&d| d as usize).collect();
            if tensors.contains_key(&name) {
                return Err(corrupt(format!("tensor '{name}' appears twice")));
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    shape,
                    type_id,
                    dtype,
                    offset,
                    size,
                    file: 0,
                    permute: None,
                    transcode,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            maps: vec![std::sync::Arc::new(mmap)],
            hf_tokenizer: None,
            version,
            metadata,
            tensors,
        })
    }
}
