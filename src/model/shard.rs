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

use super::block_tensors::BlockTensors;
use super::config::LlamaConfig;
use super::gguf::transcode::Transcode;
use super::gguf::GgufFile;
use super::ModelError;

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
    /// The GGUF name (for errors, and for the per-tensor choices of quantization at load).
    pub name: String,
    /// The type candle computes it as.
    pub dtype: GgmlDType,
    pub shape: Vec<usize>,
    /// The bytes as stored: of `dtype`, or of `stored`'s type.
    pub bytes: Cow<'a, [u8]>,
    /// The same bytes in the file's map, when they are a whole tensor as stored (a kernel
    /// may then use them in place).
    pub mapped: Option<super::mapped::MappedBytes>,
    /// Set when `bytes` are a type read as another ([`Transcode`]): our kernels take them so,
    /// candle's paths [`RawTensor::computed`].
    pub stored: Option<Transcode>,
}

impl RawTensor<'_> {
    pub fn into_owned(self) -> RawTensor<'static> {
        RawTensor {
            name: self.name,
            dtype: self.dtype,
            shape: self.shape,
            bytes: Cow::Owned(self.bytes.into_owned()),
            mapped: None,
            stored: self.stored,
        }
    }

    /// The bytes as `dtype`'s (a stored type rewritten).
    pub fn computed(&self) -> Cow<'_, [u8]> {
        match self.stored {
            Some(t) => Cow::Owned(t.apply(&self.bytes)),
            None => Cow::Borrowed(&self.bytes[..]),
        }
    }
}

/// Reads `spec` out of the file: the whole tensor borrowed from the map, or a copy of a part.
pub fn read<'g>(g: &'g GgufFile, spec: &TensorSpec) -> Result<RawTensor<'g>> {
    let (info, bytes) = g.tensor_stored(&spec.name, &spec.shape)?;
    if spec.is_whole() {
        let mapped = match bytes {
            Cow::Borrowed(_) => g.mapped_bytes(info),
            Cow::Owned(_) => None,
        };
        return Ok(RawTensor {
            name: spec.name.clone(),
            dtype: info.dtype,
            shape: spec.shape.clone(),
            bytes,
            mapped,
            stored: info.transcode,
        });
    }
    let cols = spec.shape.get(1).copied().unwrap_or(1);
    let (bs, ts) = match info.transcode {
        Some(t) => (t.block_size(), t.stored_block_bytes()),
        None => (info.dtype.block_size(), info.dtype.type_size()),
    };
    if !spec.cols.start.is_multiple_of(bs) || !spec.cols.end.is_multiple_of(bs) {
        return Err(ModelError::Invalid {
            path: g.path().to_path_buf(),
            detail: format!(
                "tensor '{}' ({}, blocks of {bs}) cannot be cut at columns {:?}",
                spec.name,
                info.type_name(),
                spec.cols
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
        name: spec.name.clone(),
        dtype: info.dtype,
        shape: spec.part_shape(),
        bytes: Cow::Owned(out),
        mapped: None,
        stored: info.transcode,
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
    let whole = Partition::full(c.n_layers);
    for i in 0..c.n_layers {
        let specs = block_specs(c, i, &whole);
        // The row-parallel projections, cut along their input columns.
        for spec in [&specs.wo, &specs.w_down] {
            let (name, width) = (&spec.name, spec.shape[1]);
            let info = g.tensor_info(name, "the model's architecture requires it")?;
            let bs = info.block_size();
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
                    "--tp {tp} would cut the quantization blocks of '{name}' ({}, {bs} values per block): each rank's {} input columns are not a multiple of {bs}; use a smaller --tp, or a model quantized with smaller blocks",
                    info.type_name(),
                    width / tp
                )));
            }
        }
    }
    Ok(())
}

/// The tensors of block `i` that a rank with partition `part` holds: the one description of
/// a block's tensor set (GGUF names, full shapes, this rank's cut), read by loading and
/// stored by FSDP alike.
pub fn block_specs(c: &LlamaConfig, i: usize, part: &Partition) -> BlockTensors<TensorSpec> {
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
    // Biases follow their projection's output rows; norms of a head are whole everywhere.
    let vector = |n: &str, len: usize, rows: Range<usize>| TensorSpec {
        name: format!("blk.{i}.{n}"),
        shape: vec![len],
        rows,
        cols: 0..1,
    };
    let gemma = c.arch.is_gemma();
    BlockTensors {
        attn_norm: TensorSpec::whole(name("attn_norm"), &[d]),
        wq: spec("attn_q", [q, d], q_rows.clone(), 0..d),
        wk: spec("attn_k", [kv, d], kv_rows.clone(), 0..d),
        wv: spec("attn_v", [kv, d], kv_rows.clone(), 0..d),
        wo: spec("attn_output", [d, q], 0..d, q_rows.clone()),
        ffn_norm: TensorSpec::whole(name("ffn_norm"), &[d]),
        w_gate: spec("ffn_gate", [ff, d], ff_part.clone(), 0..d),
        w_up: spec("ffn_up", [ff, d], ff_part.clone(), 0..d),
        w_down: spec("ffn_down", [d, ff], 0..d, ff_part),
        bq: c
            .attn_bias
            .then(|| vector("attn_q.bias", q, q_rows.clone())),
        bk: c
            .attn_bias
            .then(|| vector("attn_k.bias", kv, kv_rows.clone())),
        bv: c.attn_bias.then(|| vector("attn_v.bias", kv, kv_rows)),
        bo: c
            .attn_output_bias
            .then(|| vector("attn_output.bias", d, 0..d)),
        q_norm: c
            .qk_norm
            .then(|| TensorSpec::whole(name("attn_q_norm"), &[hd])),
        k_norm: c
            .qk_norm
            .then(|| TensorSpec::whole(name("attn_k_norm"), &[hd])),
        post_attn_norm: gemma.then(|| TensorSpec::whole(name("post_attention_norm"), &[d])),
        post_ffn_norm: gemma.then(|| TensorSpec::whole(name("post_ffw_norm"), &[d])),
    }
}

/// One tensor's place in a layer's concatenated bytes.
#[derive(Debug, Clone)]
pub struct ShardEntry {
    pub name: String,
    pub dtype: GgmlDType,
    /// The stored type when the bytes are one read as `dtype` (see [`RawTensor::stored`]).
    pub stored: Option<Transcode>,
    pub shape: Vec<usize>,
    pub len: usize,
}

/// A block stored FSDP-style: the tensors' bytes concatenated (in [`BlockTensors`] order),
/// and this rank's contiguous `1/N` piece of them. Gathering every rank's piece in order
/// gives back the exact bytes.
pub struct LayerShard {
    /// Boxed: a block's entries are large, and a rank's layers are mostly resident blocks.
    pub entries: Box<BlockTensors<ShardEntry>>,
    pub total: usize,
    pub piece: Vec<u8>,
}

impl LayerShard {
    /// Keeps piece `rank` of `parts` of the concatenated tensors.
    pub fn new(tensors: &BlockTensors<RawTensor<'_>>, rank: usize, parts: usize) -> Self {
        let entries = Box::new(tensors.as_ref().map(|t| ShardEntry {
            name: t.name.clone(),
            dtype: t.dtype,
            stored: t.stored,
            shape: t.shape.clone(),
            len: t.bytes.len(),
        }));
        let total = entries.iter().map(|e| e.len).sum();
        let range = split(total, parts, rank);
        let mut piece = Vec::with_capacity(range.len());
        let mut pos = 0;
        for t in tensors.iter() {
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

    /// Splits the gathered bytes (every piece, in rank order) back into the block's tensors.
    pub fn unpack(&self, all: Vec<Vec<u8>>) -> Result<BlockTensors<RawTensor<'static>>> {
        let bytes: Vec<u8> = all.concat();
        if bytes.len() != self.total {
            return Err(ModelError::Run(format!(
                "FSDP gather returned {} bytes for a layer of {}",
                bytes.len(),
                self.total
            )));
        }
        let mut pos = 0;
        Ok(BlockTensors::as_ref(&self.entries).map(|e| {
            let t = RawTensor {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: e.shape.clone(),
                bytes: Cow::Owned(bytes[pos..pos + e.len].to_vec()),
                mapped: None,
                stored: e.stored,
            };
            pos += e.len;
            t
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Arch;
    use crate::test_util::tiny_config;

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

    fn names(specs: &BlockTensors<TensorSpec>) -> Vec<&str> {
        specs.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn block_specs_list_each_family_s_tensors_in_the_canonical_order() {
        let base = [
            "blk.1.attn_norm.weight",
            "blk.1.attn_q.weight",
            "blk.1.attn_k.weight",
            "blk.1.attn_v.weight",
            "blk.1.attn_output.weight",
            "blk.1.ffn_norm.weight",
            "blk.1.ffn_gate.weight",
            "blk.1.ffn_up.weight",
            "blk.1.ffn_down.weight",
        ];
        let with = |extra: &[&'static str]| [&base[..], extra].concat();
        for (arch, expected) in [
            (Arch::Llama, with(&["blk.1.attn_output.bias"])),
            (Arch::Mistral, with(&[])),
            (
                Arch::Qwen2,
                with(&[
                    "blk.1.attn_q.bias",
                    "blk.1.attn_k.bias",
                    "blk.1.attn_v.bias",
                ]),
            ),
            (
                Arch::Qwen3,
                with(&["blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"]),
            ),
            (
                Arch::Gemma3,
                with(&[
                    "blk.1.attn_q_norm.weight",
                    "blk.1.attn_k_norm.weight",
                    "blk.1.post_attention_norm.weight",
                    "blk.1.post_ffw_norm.weight",
                ]),
            ),
        ] {
            let c = tiny_config(arch);
            let specs = block_specs(&c, 1, &Partition::full(c.n_layers));
            assert_eq!(names(&specs), expected, "{arch}");
            assert!(specs.iter().all(|s| s.is_whole()), "{arch}");
        }
    }

    #[test]
    fn block_specs_cut_heads_and_channels_for_tensor_parallelism() {
        let c = tiny_config(Arch::Qwen2);
        let part = Partition {
            tp_rank: 1,
            tp: 2,
            ..Partition::full(c.n_layers)
        };
        let s = block_specs(&c, 0, &part);
        // Rank 1 of 2: heads 2..4 (rows 16..32), KV head 1 (rows 8..16), channels 24..48.
        assert_eq!((s.wq.rows.clone(), s.wq.cols.clone()), (16..32, 0..32));
        assert_eq!((s.wk.rows.clone(), s.wv.rows.clone()), (8..16, 8..16));
        assert_eq!((s.wo.rows.clone(), s.wo.cols.clone()), (0..32, 16..32));
        assert_eq!(s.w_gate.rows, 24..48);
        assert_eq!(s.w_up.rows, 24..48);
        assert_eq!(
            (s.w_down.rows.clone(), s.w_down.cols.clone()),
            (0..32, 24..48)
        );
        let bias_rows = |b: &Option<TensorSpec>| b.as_ref().map(|b| b.rows.clone());
        assert_eq!(bias_rows(&s.bq), Some(16..32));
        assert_eq!(bias_rows(&s.bk), Some(8..16));
        assert_eq!(bias_rows(&s.bv), Some(8..16));
        assert!(s.attn_norm.is_whole() && s.ffn_norm.is_whole());
        assert_eq!(s.wo.part_shape(), vec![32, 16]);
    }

    #[test]
    fn fsdp_pieces_reassemble_the_exact_bytes() {
        let c = tiny_config(Arch::Gemma3);
        let specs = block_specs(&c, 2, &Partition::full(c.n_layers));
        let mut seed = 0u8;
        let tensors = specs.map(|s| {
            seed = seed.wrapping_add(1);
            let n: usize = s.shape.iter().product();
            RawTensor {
                dtype: GgmlDType::F32,
                shape: s.shape,
                bytes: Cow::Owned((0..n * 4).map(|i| seed.wrapping_mul(i as u8)).collect()),
                mapped: None,
                stored: None,
                name: s.name,
            }
        });
        for parts in 1..6 {
            let shards: Vec<LayerShard> = (0..parts)
                .map(|r| LayerShard::new(&tensors, r, parts))
                .collect();
            let pieces: Vec<Vec<u8>> = shards.iter().map(|s| s.piece.clone()).collect();
            let back = shards[0].unpack(pieces).unwrap();
            assert_eq!(back.iter().count(), 13);
            assert!(back.bo.is_none() && back.bq.is_none());
            let back_norm = back.post_ffn_norm.as_ref().unwrap();
            assert_eq!(back_norm.name, "blk.2.post_ffw_norm.weight");
            for (a, b) in tensors.iter().zip(back.iter()) {
                assert_eq!(a.name, b.name);
                assert_eq!(a.bytes, b.bytes);
                assert_eq!(a.shape, b.shape);
            }
        }
        let shard = LayerShard::new(&tensors, 0, 2);
        let short = vec![shard.piece.clone()];
        assert!(matches!(shard.unpack(short), Err(ModelError::Run(_))));
    }
}
