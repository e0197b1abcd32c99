//! Sharding a model across ranks: which part of the model a rank holds ([`Partition`]), how a
//! tensor is cut for tensor parallelism ([`TensorSpec`], read straight out of the GGUF bytes,
//! quantized blocks intact), and FSDP-style storage of a layer in `1/N` pieces
//! ([`LayerShard`]).
//!
//! Tensor-parallel cuts follow Megatron-LM: Q, K, V, gate and up are split by output rows
//! (column-parallel: whole heads, whole MLP channels per rank), the attention output and down
//! projections by input columns (row-parallel: partial sums, all-reduced afterwards), the
//! vocabulary (embedding and output layer) by rows. A row cut never touches a quantization
//! block; a column cut must fall on a block boundary ([`check_tensor_parallel`]).

use std::borrow::Cow;
use std::ops::Range;

use candle_core::quantized::GgmlDType;

use super::gguf::GgufFile;
use super::{LlamaConfig, ModelError};

type Result<T> = std::result::Result<T, ModelError>;

/// What one rank holds of a model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Partition {
    /// Transformer blocks, by index.
    pub layers: Range<usize>,
    /// The token embedding (first pipeline stage).
    pub embed: bool,
    /// Final norm and output layer (last pipeline stage).
    pub head: bool,
    /// Tensor-parallel index and degree.
    pub tp_rank: usize,
    pub tp: usize,
    /// FSDP index and degree: each block is stored as one piece of `fsdp`.
    pub fsdp_rank: usize,
    pub fsdp: usize,
}

impl Partition {
    /// The whole model on one rank.
    pub fn full(n_layers: usize) -> Self {
        Self {
            layers: 0..n_layers,
            embed: true,
            head: true,
            tp_rank: 0,
            tp: 1,
            fsdp_rank: 0,
            fsdp: 1,
        }
    }

    pub fn is_full(&self, n_layers: usize) -> bool {
        *self == Self::full(n_layers)
    }

    /// This rank's share of `n` (rows, heads, channels) under tensor parallelism.
    pub fn tp_range(&self, n: usize) -> Range<usize> {
        split(n, self.tp, self.tp_rank)
    }
}

/// Part `i` of `n` split into `parts` contiguous pieces, earlier pieces one larger.
pub fn split(n: usize, parts: usize, i: usize) -> Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// A tensor to read: its full `[rows, cols]` shape and the part of it wanted.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub rows: Range<usize>,
    pub cols: Range<usize>,
}

impl TensorSpec {
    pub fn whole(name: String, shape: &[usize]) -> Self {
        let rows = 0..shape[0];
        let cols = 0..shape.get(1).copied().unwrap_or(1);
        Self {
            name,
            shape: shape.to_vec(),
            rows,
            cols,
        }
    }

    /// Shape of the part read.
    pub fn part_shape(&self) -> Vec<usize> {
        if self.shape.len() == 1 {
            vec![self.rows.len()]
        } else {
            vec![self.rows.len(), self.cols.len()]
        }
    }

    fn is_whole(&self) -> bool {
        self.rows == (0..self.shape[0]) && self.cols == (0..self.shape.get(1).copied().unwrap_or(1))
    }
}

/// A tensor's bytes as stored (quantized blocks intact), possibly a part of the file's tensor.
pub struct RawTensor<'a> {
    pub dtype: GgmlDType,
    pub shape: Vec<usize>,
    pub bytes: Cow<'a, [u8]>,
    /// The same bytes in the file's map, when they are a whole tensor as stored (a kernel
    /// may then use them in place).
    pub mapped: Option<super::mapped::MappedBytes>,
}

impl RawTensor<'_> {
    pub fn into_owned(self) -> RawTensor<'static> {
        RawTensor {
            dtype: self.dtype,
            shape: self.shape,
            bytes: Cow::Owned(self.bytes.into_owned()),
            mapped: None,
        }
    }
}

/// Reads `spec` out of the file: the whole tensor borrowed from the map, or a copy of a part.
pub fn read<'g>(g: &'g GgufFile, spec: &TensorSpec) -> Result<RawTensor<'g>> {
    let (info, bytes) = g.tensor_data(&spec.name, &spec.shape)?;
    if spec.is_whole() {
        let mapped = match bytes {
            Cow::Borrowed(_) => g.mapped_bytes(info),
            Cow::Owned(_) => None,
        };
        return Ok(RawTensor {
            dtype: info.dtype,
            shape: spec.shape.clone(),
            bytes,
            mapped,
        });
    }
    let cols = spec.shape.get(1).copied().unwrap_or(1);
    let (bs, ts) = (info.dtype.block_size(), info.dtype.type_size());
    if !spec.cols.start.is_multiple_of(bs) || !spec.cols.end.is_multiple_of(bs) {
        return Err(ModelError::Invalid {
            path: g.path().to_path_buf(),
            detail: format!(
                "tensor '{}' ({:?}, blocks of {bs}) cannot be cut at columns {:?}",
                spec.name, info.dtype, spec.cols
            ),
        });
    }
    let row_bytes = cols / bs * ts;
    let (c0, c1) = (spec.cols.start / bs * ts, spec.cols.end / bs * ts);
    let mut out = Vec::with_capacity(spec.rows.len() * (c1 - c0));
    for r in spec.rows.clone() {
        out.extend_from_slice(&bytes[r * row_bytes + c0..r * row_bytes + c1]);
    }
    Ok(RawTensor {
        dtype: info.dtype,
        shape: spec.part_shape(),
        bytes: Cow::Owned(out),
        mapped: None,
    })
}

/// Checks that tensor parallelism of degree `tp` can cut this model: whole heads and KV heads
/// per rank, an even split of the hidden and MLP sizes, and no quantization block cut by a
/// row-parallel (column-cut) projection. The error names the rule and the fix.
pub fn check_tensor_parallel(
    g: &GgufFile,
    c: &LlamaConfig,
    tp: usize,
    quantize: Option<&super::Quantize>,
) -> Result<()> {
    if tp <= 1 {
        return Ok(());
    }
    let invalid = |detail: String| ModelError::Invalid {
        path: g.path().to_path_buf(),
        detail,
    };
    let valid: Vec<String> = (2..=c.n_kv_heads)
        .filter(|t| {
            c.n_kv_heads.is_multiple_of(*t)
                && c.n_heads.is_multiple_of(*t)
                && c.hidden_size.is_multiple_of(*t)
                && c.intermediate_size.is_multiple_of(*t)
        })
        .map(|t| t.to_string())
        .collect();
    let fix = if valid.is_empty() {
        "this model cannot be split by tensor parallelism; use --pp or --dp-shard".to_string()
    } else {
        format!("use --tp {}", valid.join(" or --tp "))
    };
    for (what, n) in [
        ("KV heads", c.n_kv_heads),
        ("attention heads", c.n_heads),
        ("hidden size", c.hidden_size),
        ("MLP size", c.intermediate_size),
    ] {
        if n % tp != 0 {
            return Err(invalid(format!(
                "--tp {tp} does not divide the model's {n} {what} (tensor parallelism gives every rank an equal share); {fix}"
            )));
        }
    }
    for i in 0..c.n_layers {
        for (name, width) in [
            ("attn_output", c.n_heads * c.head_dim),
            ("ffn_down", c.intermediate_size),
        ] {
            let name = format!("blk.{i}.{name}.weight");
            let info = g.tensor_info(&name, "the model's architecture requires it")?;
            let bs = info.dtype.block_size();
            if let Some(q) = quantize {
                let block = q.scheme.block(q.group_size);
                if !(width / tp).is_multiple_of(block) {
                    return Err(invalid(format!(
                        "--tp {tp} would cut the {} groups of {block} values of '{name}' quantized at load: each rank's {} input columns are not a multiple of {block}; use a smaller --tp or --group-size",
                        q.scheme,
                        width / tp
                    )));
                }
            }
            if !(width / tp).is_multiple_of(bs) {
                return Err(invalid(format!(
                    "--tp {tp} would cut the quantization blocks of '{name}' ({:?}, {bs} values per block): each rank's {} input columns are not a multiple of {bs}; use a smaller --tp, or a model quantized with smaller blocks",
                    info.dtype,
                    width / tp
                )));
            }
        }
    }
    Ok(())
}

/// The tensors of block `i` that a rank with partition `part` holds.
pub fn block_specs(c: &LlamaConfig, i: usize, part: &Partition) -> Vec<TensorSpec> {
    let name = |n: &str| format!("blk.{i}.{n}.weight");
    let d = c.hidden_size;
    let q = c.n_heads * c.head_dim;
    let kv = c.n_kv_heads * c.head_dim;
    let ff = c.intermediate_size;
    let heads = part.tp_range(c.n_heads);
    let kv_heads = part.tp_range(c.n_kv_heads);
    let hd = c.head_dim;
    let q_rows = heads.start * hd..heads.end * hd;
    let kv_rows = kv_heads.start * hd..kv_heads.end * hd;
    let ff_part = part.tp_range(ff);
    let spec = |n: &str, shape: [usize; 2], rows: Range<usize>, cols: Range<usize>| TensorSpec {
        name: name(n),
        shape: shape.to_vec(),
        rows,
        cols,
    };
    let mut specs = vec![
        TensorSpec::whole(name("attn_norm"), &[d]),
        spec("attn_q", [q, d], q_rows.clone(), 0..d),
        spec("attn_k", [kv, d], kv_rows.clone(), 0..d),
        spec("attn_v", [kv, d], kv_rows.clone(), 0..d),
        spec("attn_output", [d, q], 0..d, q_rows.clone()),
        TensorSpec::whole(name("ffn_norm"), &[d]),
        spec("ffn_gate", [ff, d], ff_part.clone(), 0..d),
        spec("ffn_up", [ff, d], ff_part.clone(), 0..d),
        spec("ffn_down", [d, ff], 0..d, ff_part),
    ];
    // Biases follow their projection's output rows; norms of a head are whole everywhere.
    let vector = |n: &str, len: usize, rows: Range<usize>| TensorSpec {
        name: format!("blk.{i}.{n}"),
        shape: vec![len],
        rows,
        cols: 0..1,
    };
    if c.attn_bias {
        specs.push(vector("attn_q.bias", q, q_rows));
        specs.push(vector("attn_k.bias", kv, kv_rows.clone()));
        specs.push(vector("attn_v.bias", kv, kv_rows));
    }
    if c.attn_output_bias {
        specs.push(vector("attn_output.bias", d, 0..d));
    }
    if c.qk_norm {
        specs.push(TensorSpec::whole(name("attn_q_norm"), &[hd]));
        specs.push(TensorSpec::whole(name("attn_k_norm"), &[hd]));
    }
    if c.arch.is_gemma() {
        specs.push(TensorSpec::whole(name("post_attention_norm"), &[d]));
        specs.push(TensorSpec::whole(name("post_ffw_norm"), &[d]));
    }
    specs
}

/// One tensor's place in a layer's concatenated bytes.
#[derive(Debug, Clone)]
pub struct ShardEntry {
    pub dtype: GgmlDType,
    pub shape: Vec<usize>,
    pub len: usize,
}

/// A block stored FSDP-style: the tensors' bytes concatenated, and this rank's contiguous
/// `1/N` piece of them. Gathering every rank's piece in order gives back the exact bytes.
pub struct LayerShard {
    pub entries: Vec<ShardEntry>,
    pub total: usize,
    pub piece: Vec<u8>,
}

impl LayerShard {
    /// Keeps piece `rank` of `parts` of the concatenated tensors.
    pub fn new(tensors: &[RawTensor<'_>], rank: usize, parts: usize) -> Self {
        let entries: Vec<ShardEntry> = tensors
            .iter()
            .map(|t| ShardEntry {
                dtype: t.dtype,
                shape: t.shape.clone(),
                len: t.bytes.len(),
            })
            .collect();
        let total = entries.iter().map(|e| e.len).sum();
        let range = split(total, parts, rank);
        let mut piece = Vec::with_capacity(range.len());
        let mut pos = 0;
        for t in tensors {
            let (a, b) = (pos, pos + t.bytes.len());
            let (lo, hi) = (range.start.max(a), range.end.min(b));
            if lo < hi {
                piece.extend_from_slice(&t.bytes[lo - a..hi - a]);
            }
            pos = b;
        }
        Self {
            entries,
            total,
            piece,
        }
    }

    /// Splits the gathered bytes (every piece, in rank order) back into tensors.
    pub fn unpack(&self, all: Vec<Vec<u8>>) -> Result<Vec<RawTensor<'static>>> {
        let bytes: Vec<u8> = all.concat();
        if bytes.len() != self.total {
            return Err(ModelError::Run(format!(
                "FSDP gather returned {} bytes for a layer of {}",
                bytes.len(),
                self.total
            )));
        }
        let mut out = Vec::with_capacity(self.entries.len());
        let mut pos = 0;
        for e in &self.entries {
            out.push(RawTensor {
                dtype: e.dtype,
                shape: e.shape.clone(),
                bytes: Cow::Owned(bytes[pos..pos + e.len].to_vec()),
                mapped: None,
            });
            pos += e.len;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 7, 30, 49152] {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn fsdp_pieces_reassemble_the_exact_bytes() {
        let tensors: Vec<RawTensor<'static>> = [(7usize, 1u8), (20, 2), (3, 3)]
            .iter()
            .map(|&(n, v)| RawTensor {
                dtype: GgmlDType::F32,
                shape: vec![n],
                bytes: Cow::Owned((0..n * 4).map(|i| v.wrapping_mul(i as u8)).collect()),
                mapped: None,
            })
            .collect();
        for parts in 1..6 {
            let shards: Vec<LayerShard> = (0..parts)
                .map(|r| LayerShard::new(&tensors, r, parts))
                .collect();
            let pieces: Vec<Vec<u8>> = shards.iter().map(|s| s.piece.clone()).collect();
            let back = shards[0].unpack(pieces).unwrap();
            for (a, b) in tensors.iter().zip(&back) {
                assert_eq!(a.bytes, b.bytes);
                assert_eq!(a.shape, b.shape);
            }
        }
    }
}
