//! Random-weight models of real shapes (`ppl synth`): the speed and memory of a 1B–8B model
//! can be measured without downloading it, because both depend on the shapes and the storage
//! types, not on the values. The perplexity of such a model means nothing.
//!
//! A model is a [`Shape`] (named after a real model's `config.json`, or custom dimensions)
//! plus a [`WeightType`]. Its tensors ([`tensor_plan`]) get values that depend only on the
//! seed, the tensor's GGUF name and the row ([`RowValues`]): uniform with the standard
//! deviation of the usual N(0, 0.02) initialisation, norms 1.0, so activations stay finite
//! through every layer. Because each row is generated on its own, the writers never hold
//! more than a few rows of one tensor: [`gguf_stream`] writes GGUF v3 with the whole header
//! computed first, [`hf_stream`] a Hugging Face checkpoint (BF16 safetensors, `config.json`,
//! `tokenizer.json`) whose Llama Q/K rows are put in Hugging Face's rotary order, so that both
//! forms hold the same model.

pub mod gguf_stream;
pub mod hf_stream;
mod shapes;

pub use shapes::{shape_names, Family, Shape};

use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::gguf::transcode::{StoredType, Transcode};
use super::gguf::Value;
use super::gguf_write::Written;
use super::kernels::kquant::iq4xs;
use super::quantize::{ggml_type_for, Quantize, Scheme, Site};
use super::GgufFile;
use crate::model::tokenizer_meta::ExportTokenizer;

/// Errors building or writing a synthetic model.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("--shape {name}: no such shape; known shapes: {known}, or custom (with --hidden, --layers, --heads, --kv-heads, --ffn)")]
    UnknownShape { name: String, known: String },
    #[error("{0}")]
    InvalidShape(String),
    #[error("--tokenizer-from {path}: {detail}")]
    Tokenizer { path: PathBuf, detail: String },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode tensor '{tensor}': {source}")]
    Encode {
        tensor: String,
        source: Box<candle_core::Error>,
    },
    #[error("{0}")]
    Unsupported(String),
}

/// Storage types `ppl synth --type` writes (K-quants need rows of multiples of 256 and fall
/// back as llama.cpp's quantizer does: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightType {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q5_1")]
    Q5_1,
    #[value(name = "q2_k")]
    Q2K,
    #[value(name = "q3_k")]
    Q3K,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q5_k")]
    Q5K,
    #[value(name = "q6_k")]
    Q6K,
    /// llama.cpp's Q4_K_M mix (the rule of `ppl quantize --type q4_k_m`): Q6_K for the
    /// output layer (or the tied table) and for `attn_v`/`ffn_down` of some layers.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// IQ4_XS (256-value super-blocks, a 4-bit index into IQ4_NL's table per value), with
    /// IQ4_NL where rows are not a multiple of 256 (llama.cpp's fallback). ppl reads both and
    /// writes them only here: a plain quantizer for random weights, not llama.cpp's search.
    #[value(name = "iq4_xs")]
    Iq4Xs,
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).map(|v| v.get_name().to_string());
        f.write_str(name.as_deref().unwrap_or("?"))
    }
}

impl WeightType {
    /// The main GGUF type (a mix: its most common type).
    pub fn ggml(self) -> GgmlDType {
        match self {
            WeightType::F32 => GgmlDType::F32,
            WeightType::F16 => GgmlDType::F16,
            WeightType::Bf16 => GgmlDType::BF16,
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q4_0 => GgmlDType::Q4_0,
            WeightType::Q4_1 => GgmlDType::Q4_1,
            WeightType::Q5_0 => GgmlDType::Q5_0,
            WeightType::Q5_1 => GgmlDType::Q5_1,
            WeightType::Q2K => GgmlDType::Q2K,
            WeightType::Q3K => GgmlDType::Q3K,
            WeightType::Q4K | WeightType::Q4KM => GgmlDType::Q4K,
            WeightType::Q5K => GgmlDType::Q5K,
            WeightType::Q6K => GgmlDType::Q6K,
            // The type candle computes IQ4_XS as.
            WeightType::Iq4Xs => GgmlDType::F32,
        }
    }

    /// The smallest block any matrix of this type may use (after the K-quant fallbacks).
    fn min_block(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::Bf16 => 1,
            _ => 32,
        }
    }

    fn is_quantized(self) -> bool {
        self.min_block() > 1
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`; a pure K-quant is its `_S`).
    pub fn file_type(self) -> u32 {
        match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q4_0 => 2,
            WeightType::Q4_1 => 3,
            WeightType::Q8_0 => 7,
            WeightType::Q5_0 => 8,
            WeightType::Q5_1 => 9,
            WeightType::Q2K => 10,
            WeightType::Q3K => 11,
            WeightType::Q4K => 14,
            WeightType::Q4KM => 15,
            WeightType::Q5K => 16,
            WeightType::Q6K => 18,
            WeightType::Iq4Xs => 30,
            WeightType::Bf16 => 32,
        }
    }

    /// The GGUF type of a matrix with rows of `cols` values at `site`.
    pub fn for_matrix(self, site: &Site, cols: usize) -> StoredType {
        if self == WeightType::Iq4Xs {
            let t = if cols.is_multiple_of(256) {
                Transcode::Iq4XsAsF32
            } else {
                Transcode::Iq4NlAsQ8_0
            };
            return StoredType::Rewritten(t);
        }
        if self == WeightType::Q4KM {
            let mix = Quantize {
                scheme: Scheme::Q4KM,
                group_size: 32,
                embeddings: true,
                output: true,
            };
            if let Some(t) = mix.ggml_type(site, cols) {
                return t.into();
            }
        }
        ggml_type_for(self.ggml(), cols).into()
    }
}

/// What a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A weight matrix: random values, stored in the model's type.
    Matrix,
    /// An RMSNorm weight: 1.0 (F32).
    Norm,
    /// A bias: random values that BF16 holds exactly (stored F32).
    Bias,
}

/// One tensor of the model, by its GGUF name.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// Dimensions outermost first (`[rows, cols]` for a matrix).
    pub shape: Vec<usize>,
    pub kind: TensorKind,
}

impl TensorSpec {
    /// (rows, values per row); a vector is one row.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [rows, cols] => (*rows, *cols),
            other => (1, other.iter().product()),
        }
    }
}

/// The tensors of a model of `shape`, in file order: the embedding table, the blocks, the
/// final norm and (untied) the output layer.
pub fn tensor_plan(shape: &Shape) -> Vec<TensorSpec> {
    let (d, ff, v) = (shape.hidden, shape.ffn, shape.vocab);
    let q = shape.heads * shape.head_dim;
    let kv = shape.kv_heads * shape.head_dim;
    let spec = |name: String, dims: &[usize], kind| TensorSpec {
        name,
        shape: dims.to_vec(),
        kind,
    };
    let mut out = vec![spec(
        "token_embd.weight".into(),
        &[v, d],
        TensorKind::Matrix,
    )];
    let gemma = shape.family == Family::Gemma3;
    for i in 0..shape.layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        out.push(spec(b("attn_norm.weight"), &[d], TensorKind::Norm));
        out.push(spec(b("attn_q.weight"), &[q, d], TensorKind::Matrix));
        out.push(spec(b("attn_k.weight"), &[kv, d], TensorKind::Matrix));
        out.push(spec(b("attn_v.weight"), &[kv, d], TensorKind::Matrix));
        if shape.qkv_bias {
            out.push(spec(b("attn_q.bias"), &[q], TensorKind::Bias));
            out.push(spec(b("attn_k.bias"), &[kv], TensorKind::Bias));
            out.push(spec(b("attn_v.bias"), &[kv], TensorKind::Bias));
        }
        if gemma {
            out.push(spec(
                b("attn_q_norm.weight"),
                &[shape.head_dim],
                TensorKind::Norm,
            ));
            out.push(spec(
                b("attn_k_norm.weight"),
                &[shape.head_dim],
                TensorKind::Norm,
            ));
        }
        out.push(spec(b("attn_output.weight"), &[d, q], TensorKind::Matrix));
        if gemma {
            out.push(spec(
                b("post_attention_norm.weight"),
                &[d],
                TensorKind::Norm,
            ));
        }
        out.push(spec(b("ffn_norm.weight"), &[d], TensorKind::Norm));
        out.push(spec(b("ffn_gate.weight"), &[ff, d], TensorKind::Matrix));
        out.push(spec(b("ffn_up.weight"), &[ff, d], TensorKind::Matrix));
        out.push(spec(b("ffn_down.weight"), &[d, ff], TensorKind::Matrix));
        if gemma {
            out.push(spec(b("post_ffw_norm.weight"), &[d], TensorKind::Norm));
        }
    }
    out.push(spec("output_norm.weight".into(), &[d], TensorKind::Norm));
    if !shape.tied {
        out.push(spec("output.weight".into(), &[v, d], TensorKind::Matrix));
    }
    out
}

/// The GGUF type each tensor of `plan` is stored in.
pub fn storage_types(shape: &Shape, plan: &[TensorSpec], dtype: WeightType) -> Vec<StoredType> {
    plan.iter()
        .map(|t| match t.kind {
            TensorKind::Norm | TensorKind::Bias => GgmlDType::F32.into(),
            TensorKind::Matrix => {
                let site = Site {
                    name: &t.name,
                    n_layers: shape.layers,
                    output: t.name == "output.weight"
                        || (shape.tied && t.name == "token_embd.weight"),
                };
                dtype.for_matrix(&site, t.rows_cols().1)
            }
        })
        .collect()
}

/// A model to write: its shape (vocabulary = the tokenizer's), storage type and seed, and
/// the GGUF whose tokenizer it carries.
pub struct Synth<'a> {
    pub shape: Shape,
    pub dtype: WeightType,
    pub seed: u64,
    pub tokenizer: &'a GgufFile,
}

impl<'a> Synth<'a> {
    /// Takes the vocabulary size from `tokenizer` (the embedding rows must equal it) and
    /// checks the shape for `dtype`.
    pub fn new(
        mut shape: Shape,
        dtype: WeightType,
        seed: u64,
        tokenizer: &'a GgufFile,
    ) -> Result<Self, SynthError> {
        let fail = |detail: String| SynthError::Tokenizer {
            path: tokenizer.path().to_path_buf(),
            detail,
        };
        if tokenizer.is_hf() {
            return Err(fail(
                "is a Hugging Face checkpoint; give a GGUF file, whose tokenizer.ggml.* metadata is copied (e.g. the SmolLM2 test model of `ppl fetch-model`)".into(),
            ));
        }
        let tokens = tokenizer
            .get_str_array("tokenizer.ggml.tokens", "a tokenizer")
            .map_err(|e| fail(format!("{e}; give a GGUF model that carries its tokenizer")))?;
        shape.vocab = tokens.len();
        shape.validate(dtype)?;
        Ok(Self {
            shape,
            dtype,
            seed,
            tokenizer,
        })
    }

    /// The GGUF metadata: general keys, the architecture's hyper-parameters, then every
    /// `tokenizer.*` key of the tokenizer's file.
    pub fn gguf_metadata(&self) -> Vec<(String, Value)> {
        let s = &self.shape;
        let arch = s.family.gguf_arch();
        let u = |v: usize| Value::U32(v as u32);
        let mut m: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.gguf_name().into())),
            (
                "general.name".into(),
                Value::String(format!(
                    "ppl synth {} (random weights, seed {}: speed and memory only, PPL meaningless)",
                    s.name, self.seed
                )),
            ),
            ("general.file_type".into(), Value::U32(self.dtype.file_type())),
            ("general.alignment".into(), u(gguf_stream::ALIGNMENT as usize)),
        ];
        if self.dtype.is_quantized() {
            m.push(("general.quantization_version".into(), Value::U32(2)));
        }
        let mut put = |k: &str, v: Value| m.push((format!("{arch}.{k}"), v));
        put("context_length", u(s.context_length));
        put("embedding_length", u(s.hidden));
        put("block_count", u(s.layers));
        put("feed_forward_length", u(s.ffn));
        put("attention.head_count", u(s.heads));
        put("attention.head_count_kv", u(s.kv_heads));
        put("attention.key_length", u(s.head_dim));
        put("attention.value_length", u(s.head_dim));
        put("rope.dimension_count", u(s.head_dim));
        put("rope.freq_base", Value::F32(s.rope_theta as f32));
        put(
            "attention.layer_norm_rms_epsilon",
            Value::F32(s.norm_eps as f32),
        );
        put("vocab_size", u(s.vocab));
        if let (Family::Gemma3, Some(w)) = (s.family, s.sliding_window) {
            put("attention.sliding_window", u(w));
        }
        m.extend(
            self.tokenizer
                .metadata
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        m
    }

    /// Writes the GGUF file `out`, one tensor at a time; `progress(index, count, name)` is
    /// called before each tensor.
    pub fn write_gguf(
        &self,
        out: &Path,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<Written, SynthError> {
        let plan = tensor_plan(&self.shape);
        let types = storage_types(&self.shape, &plan, self.dtype);
        let entries: Vec<gguf_stream::TensorEntry> = plan
            .iter()
            .zip(&types)
            .map(|(t, &dtype)| gguf_stream::TensorEntry {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype,
            })
            .collect();
        let layout = gguf_stream::Layout::new(&self.gguf_metadata(), entries)?;
        let bytes = layout.write(out, |index, entry, sink| {
            let spec = &plan[index];
            progress(index, plan.len(), &spec.name);
            let values = RowValues::new(self.seed, spec, 1.0);
            let cols = spec.rows_cols().1;
            RowStream::new(spec, entry.dtype)
                .run(|r, out| values.push_row(r, cols, out), |b| sink(b))
                .map(|_| ())
        })?;
        Ok(Written {
            tensors: plan.len(),
            bytes,
            types: plan.iter().map(|t| t.name.clone()).zip(types).collect(),
        })
    }

    /// Writes the Hugging Face checkpoint directory `out` (BF16 safetensors, `config.json`,
    /// `tokenizer.json`).
    pub fn write_safetensors(
        &self,
        out: &Path,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<Written, SynthError> {
        let tok =
            self.tokenizer
                .checkpoint_tokenizer()
                .map_err(|detail| SynthError::Tokenizer {
                    path: self.tokenizer.path().to_path_buf(),
                    detail,
                })?;
        hf_stream::write_checkpoint(self, &tok, out, progress)
    }
}

/// The standard deviation of the random values (GPT-2/Llama-style initialisation).
pub const WEIGHT_STD: f32 = 0.02;

/// The values of the rows of one tensor: a pure function of (seed, tensor name, row), so any
/// row can be produced alone, in any order, on any thread.
#[derive(Debug, Clone, Copy)]
pub struct RowValues {
    seed: u64,
    name_hash: u64,
    kind: TensorKind,
    /// The value of a norm weight: 1.0 where the model multiplies by the weight (GGUF), 0.0
    /// where it multiplies by 1 + weight (Gemma's Hugging Face checkpoints).
    norm_value: f32,
}

/// SplitMix64's output function: a well-mixed 64-bit value from any input.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name: rows of different tensors draw from different streams.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl RowValues {
    pub fn new(seed: u64, spec: &TensorSpec, norm_value: f32) -> Self {
        Self {
            seed,
            name_hash: name_hash(&spec.name),
            kind: spec.kind,
            norm_value,
        }
    }

    /// Appends row `row` (`cols` values) to `out`.
    pub fn push_row(&self, row: usize, cols: usize, out: &mut Vec<f32>) {
        if self.kind == TensorKind::Norm {
            out.extend(std::iter::repeat_n(self.norm_value, cols));
            return;
        }
        // Uniform on [-a, a] has standard deviation a / √3.
        let a = WEIGHT_STD * 3f32.sqrt();
        let scale = 2.0 * a / (1u32 << 24) as f32;
        let mut state = mix64(self.seed ^ mix64(self.name_hash ^ mix64(row as u64)));
        let mut left = cols;
        while left > 0 {
            // SplitMix64: a Weyl sequence through the mixer; 24 bits per value, two per draw.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = mix64(state);
            for bits in [(z >> 40) as u32, ((z >> 8) & 0xff_ffff) as u32] {
                if left == 0 {
                    break;
                }
                let v = bits as f32 * scale - a;
                // Biases are F32 in GGUF and BF16 in a checkpoint: values BF16 can hold make
                // both forms the same model.
                out.push(match self.kind {
                    TensorKind::Bias => half::bf16::from_f32(v).to_f32(),
                    _ => v,
                });
                left -= 1;
            }
        }
    }
}

/// Values per encoding job by default: rows are grouped into jobs of about this many values,
/// jobs run on rayon's threads, and one group of jobs is in memory at a time.
const JOB_VALUES: usize = 1 << 20;

/// One tensor's rows on their way to storage bytes.
#[derive(Debug, Clone)]
pub struct RowStream {
    /// The tensor's name, for errors.
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub dtype: StoredType,
    /// About how many values one parallel job encodes.
    pub job_values: usize,
}

impl RowStream {
    pub fn new(spec: &TensorSpec, dtype: impl Into<StoredType>) -> Self {
        let (rows, cols) = spec.rows_cols();
        Self {
            name: spec.name.clone(),
            rows,
            cols,
            dtype: dtype.into(),
            job_values: JOB_VALUES,
        }
    }

    /// Encodes every row (row `r` appended by `row(r, out)`) into the type's bytes and hands
    /// them to `sink` in order, a group of parallel jobs at a time. Returns the bytes written.
    pub fn run<R, S>(&self, row: R, mut sink: S) -> Result<u64, SynthError>
    where
        R: Fn(usize, &mut Vec<f32>) + Sync,
        S: FnMut(&[u8]) -> Result<(), SynthError>,
    {
        use rayon::prelude::*;
        let (rows, cols) = (self.rows, self.cols);
        let rows_per_job = (self.job_values / cols.max(1)).max(1);
        let jobs: Vec<Range<usize>> = (0..rows)
            .step_by(rows_per_job)
            .map(|start| start..(start + rows_per_job).min(rows))
            .collect();
        let group = rayon::current_num_threads().max(1) * 2;
        let mut written = 0u64;
        for batch in jobs.chunks(group) {
            let encoded: Vec<candle_core::Result<Vec<u8>>> = batch
                .par_iter()
                .map(|range| {
                    let mut values = Vec::with_capacity(range.len() * cols);
                    for r in range.clone() {
                        row(r, &mut values);
                    }
                    encode(values, range.len(), cols, self.dtype)
                })
                .collect();
            for bytes in encoded {
                let bytes = bytes.map_err(|e| SynthError::Encode {
                    tensor: self.name.clone(),
                    source: Box::new(e),
                })?;
                written += bytes.len() as u64;
                sink(&bytes)?;
            }
        }
        Ok(written)
    }
}

/// The bytes of `rows × cols` f32 values stored as `dtype` (blocks never span rows, so
/// encoding a tensor a few rows at a time gives the bytes of the whole).
fn encode(
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    dtype: StoredType,
) -> candle_core::Result<Vec<u8>> {
    let dtype = match dtype {
        StoredType::Candle(d) => d,
        StoredType::Rewritten(Transcode::Iq4XsAsF32) => {
            let mut out = Vec::new();
            iq4xs::quantize(&values, &mut out);
            return Ok(out);
        }
        StoredType::Rewritten(Transcode::Iq4NlAsQ8_0) => {
            let mut out = Vec::new();
            iq4xs::quantize_iq4_nl(&values, &mut out);
            return Ok(out);
        }
    };
    Ok(match dtype {
        GgmlDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlDType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlDType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu)?;
            QTensor::quantize(&t, dtype)?.data()?.into_owned()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Shape {
        crate::test_util::tiny_shape()
    }

    #[test]
    fn the_vocabulary_and_tokenizer_keys_come_from_the_tokenizer_file() {
        use crate::model::gguf::tests::build_gguf;
        use std::io::Write;
        let open = |kv: &[(&str, Value)]| {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            f.write_all(&build_gguf(kv, &[("w", vec![2], vec![0.0, 1.0])]))
                .unwrap();
            (GgufFile::open(f.path()).unwrap(), f)
        };
        let tokens = Value::Array((0..96).map(|i| Value::String(format!("t{i}"))).collect());
        let (g, _f) = open(&[
            ("general.architecture", Value::String("qwen2".into())),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.tokens", tokens.clone()),
        ]);
        let s = Synth::new(tiny(), WeightType::Q8_0, 1, &g).unwrap();
        assert_eq!(s.shape.vocab, 96);
        let md = s.gguf_metadata();
        let get = |k: &str| md.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(get("tokenizer.ggml.tokens"), Some(tokens));
        assert_eq!(
            get("general.architecture"),
            Some(Value::String("llama".into()))
        );
        assert_eq!(get("llama.vocab_size"), Some(Value::U32(96)));
        assert_eq!(get("general.file_type"), Some(Value::U32(7)));
        let (bare, _f) = open(&[("general.architecture", Value::String("llama".into()))]);
        let err = Synth::new(tiny(), WeightType::F32, 1, &bare)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("--tokenizer-from") && err.contains("tokenizer.ggml.tokens"),
            "{err}"
        );
    }

    #[test]
    fn plan_has_the_architecture_tensors() {
        let mut s = tiny();
        assert_eq!(tensor_plan(&s).len(), 1 + 2 * 9 + 1);
        s.tied = false;
        s.qkv_bias = true;
        let plan = tensor_plan(&s);
        assert_eq!(plan.len(), 1 + 2 * 12 + 2);
        assert!(plan.iter().any(|t| t.name == "blk.1.attn_v.bias"));
        s.family = Family::Gemma3;
        s.qkv_bias = false;
        let names: Vec<String> = tensor_plan(&s).into_iter().map(|t| t.name).collect();
        for n in ["blk.0.attn_q_norm.weight", "blk.1.post_ffw_norm.weight"] {
            assert!(names.iter().any(|x| x == n), "{n}");
        }
    }

    #[test]
    fn q4_k_m_mix_and_fallbacks() {
        let s = Shape {
            hidden: 256,
            ffn: 512,
            layers: 8,
            ..tiny()
        };
        let plan = tensor_plan(&s);
        let types = storage_types(&s, &plan, WeightType::Q4KM);
        let of = |n: &str| types[plan.iter().position(|t| t.name == n).unwrap()];
        assert_eq!(of("token_embd.weight"), GgmlDType::Q6K); // tied: the output's type
        assert_eq!(of("blk.0.ffn_down.weight"), GgmlDType::Q6K);
        assert_eq!(of("blk.3.ffn_up.weight"), GgmlDType::Q4K);
        assert_eq!(of("blk.0.attn_norm.weight"), GgmlDType::F32);
        // IQ4_XS where rows hold whole super-blocks, IQ4_NL elsewhere (rows of 64 here).
        let iq4 = storage_types(&s, &plan, WeightType::Iq4Xs);
        let rewritten = |t| StoredType::Rewritten(t);
        assert_eq!(iq4[2], rewritten(Transcode::Iq4XsAsF32));
        let small = storage_types(&tiny(), &tensor_plan(&tiny()), WeightType::Iq4Xs);
        assert_eq!(small[2], rewritten(Transcode::Iq4NlAsQ8_0));
        assert_eq!(format!("{:?}", small[2]), "IQ4_NL");
        // Rows of 64 cannot hold 256-value blocks: Q4_K falls back to Q5_0.
        let small = storage_types(&tiny(), &tensor_plan(&tiny()), WeightType::Q4K);
        assert_eq!(small[2], GgmlDType::Q5_0);
        let err = Shape {
            hidden: 48,
            ..tiny()
        }
        .validate(WeightType::Q8_0)
        .unwrap_err();
        assert!(err.to_string().contains("--hidden = 48"), "{err}");
    }

    #[test]
    fn rows_depend_only_on_seed_name_and_row() {
        let plan = tensor_plan(&tiny());
        let v = RowValues::new(7, &plan[2], 1.0);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        v.push_row(5, 64, &mut a);
        v.push_row(4, 64, &mut b);
        b.clear();
        v.push_row(5, 64, &mut b);
        assert_eq!(a, b);
        let mut c = Vec::new();
        RowValues::new(8, &plan[2], 1.0).push_row(5, 64, &mut c);
        assert_ne!(a, c);
        // Mean ≈ 0, standard deviation ≈ 0.02, bounded.
        let mut many = Vec::new();
        for r in 0..200 {
            v.push_row(r, 63, &mut many);
        }
        let n = many.len() as f64;
        let mean = many.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (many.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 1e-3 && (sd - 0.02).abs() < 1e-3, "{mean} {sd}");
        assert!(many.iter().all(|x| x.abs() <= 0.0347));
        let mut ones = Vec::new();
        RowValues::new(7, &plan[1], 1.0).push_row(0, 64, &mut ones);
        assert!(ones.iter().all(|&x| x == 1.0));
    }

    #[test]
    fn streamed_encoding_equals_whole_tensor_encoding() {
        let (rows, cols) = (37, 256);
        let plan = tensor_plan(&Shape {
            hidden: cols,
            ..tiny()
        });
        let v = RowValues::new(3, &plan[0], 1.0);
        let mut all = Vec::new();
        for r in 0..rows {
            v.push_row(r, cols, &mut all);
        }
        let iq4 = |t| StoredType::Rewritten(t);
        for dtype in [
            GgmlDType::Q4K.into(),
            GgmlDType::Q8_0.into(),
            GgmlDType::BF16.into(),
            iq4(Transcode::Iq4XsAsF32),
            iq4(Transcode::Iq4NlAsQ8_0),
        ] {
            let whole = encode(all.clone(), rows, cols, dtype).unwrap();
            let mut streamed = Vec::new();
            let stream = RowStream {
                rows,
                // Jobs of 3 rows: the last one short.
                job_values: 3 * cols,
                ..RowStream::new(&plan[0], dtype)
            };
            let n = stream
                .run(
                    |r, out| v.push_row(r, cols, out),
                    |b| {
                        streamed.extend_from_slice(b);
                        Ok(())
                    },
                )
                .unwrap();
            assert_eq!(n, dtype.stored_bytes(rows * cols));
            assert_eq!(streamed, whole, "{dtype:?}");
        }
    }
}
