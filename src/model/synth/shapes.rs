//! The shapes `ppl synth --shape` knows: the hyper-parameters of real models, from their
//! public `config.json` files, and the checks a custom shape must pass.

use super::{tensor_plan, SynthError, WeightType};
use crate::model::arch::Arch;

/// The architecture family: which GGUF `general.architecture` and which Hugging Face
/// `model_type` the model is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    Llama,
    /// Mistral 7B: llama.cpp's converter writes it as `llama` in GGUF; `mistral` in
    /// `config.json` (its 4096-position sliding window never binds at ppl's window lengths).
    Mistral,
    /// Qwen2/2.5: biases on Q, K and V; NeoX-style rotation.
    Qwen2,
    /// Gemma 3: Q/K norms, post-attention and post-FFN norms, GELU, 5 local layers of 6.
    Gemma3,
}

impl Family {
    /// The architecture a GGUF of this family is written as (llama.cpp's converter writes
    /// Mistral as `llama`).
    pub fn gguf_arch(self) -> Arch {
        match self {
            Family::Llama | Family::Mistral => Arch::Llama,
            Family::Qwen2 => Arch::Qwen2,
            Family::Gemma3 => Arch::Gemma3,
        }
    }

    /// The architecture a Hugging Face checkpoint of this family is written as.
    pub fn hf_arch(self) -> Arch {
        match self {
            Family::Mistral => Arch::Mistral,
            other => other.gguf_arch(),
        }
    }

    /// Whether Q/K rows are stored in a different order in GGUF and in Hugging Face
    /// checkpoints (llama.cpp's converter permutes them for Llama-style rotation).
    pub fn permutes_qk(self) -> bool {
        self.hf_arch().hf_permutes_qk()
    }
}

/// The hyper-parameters of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The shape's name (`custom` for custom dimensions).
    pub name: String,
    pub family: Family,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// Rows of the embedding table: always the tokenizer's vocabulary in a written model.
    pub vocab: usize,
    pub rope_theta: f64,
    pub norm_eps: f64,
    /// No `output.weight`: the output layer is the embedding table.
    pub tied: bool,
    pub qkv_bias: bool,
    pub context_length: usize,
    /// Positions a local layer attends to (Gemma 3's local layers, Mistral's window).
    pub sliding_window: Option<usize>,
}

/// One row of the named-shape table.
struct NamedShape {
    name: &'static str,
    family: Family,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    rope_theta: f64,
    norm_eps: f64,
    tied: bool,
    qkv_bias: bool,
    context_length: usize,
    sliding_window: Option<usize>,
}

/// The public `config.json` values of the models the shapes are named after:
///
/// | shape | family | hidden | layers | heads | KV | head dim | FFN | vocab | rope θ | eps | tied | QKV bias | context |
/// |---|---|---|---|---|---|---|---|---|---|---|---|---|---|
/// | smollm2-135m | llama | 576 | 30 | 9 | 3 | 64 | 1536 | 49152 | 100000 | 1e-5 | yes | no | 8192 |
/// | llama3.2-1b | llama | 2048 | 16 | 32 | 8 | 64 | 8192 | 128256 | 500000 | 1e-5 | yes | no | 131072 |
/// | llama3.1-8b | llama | 4096 | 32 | 32 | 8 | 128 | 14336 | 128256 | 500000 | 1e-5 | no | no | 131072 |
/// | qwen2.5-7b | qwen2 | 3584 | 28 | 28 | 4 | 128 | 18944 | 152064 | 1000000 | 1e-6 | no | yes | 131072 |
/// | gemma3-1b | gemma3 | 1152 | 26 | 4 | 1 | 256 | 6912 | 262144 | 1000000 (local 10000, window 512) | 1e-6 | yes | no | 32768 |
/// | mistral-7b (v0.1) | mistral | 4096 | 32 | 32 | 8 | 128 | 14336 | 32000 | 10000 | 1e-5 | no | no | 32768 (window 4096) |
///
/// The vocabulary is replaced by the tokenizer's when a model is written. Llama 3.1/3.2's
/// long-context rope scaling (`rope_freqs`) is left out: it changes values, not cost.
const NAMED_SHAPES: &[NamedShape] = &[
    NamedShape {
        name: "smollm2-135m",
        family: Family::Llama,
        hidden: 576,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        ffn: 1536,
        vocab: 49152,
        rope_theta: 100_000.0,
        norm_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        context_length: 8192,
        sliding_window: None,
    },
    NamedShape {
        name: "llama3.2-1b",
        family: Family::Llama,
        hidden: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        ffn: 8192,
        vocab: 128_256,
        rope_theta: 500_000.0,
        norm_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        context_length: 131_072,
        sliding_window: None,
    },
    NamedShape {
        name: "llama3.1-8b",
        family: Family::Llama,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        ffn: 14336,
        vocab: 128_256,
        rope_theta: 500_000.0,
        norm_eps: 1e-5,
        tied: false,
        qkv_bias: false,
        context_length: 131_072,
        sliding_window: None,
    },
    NamedShape {
        name: "qwen2.5-7b",
        family: Family::Qwen2,
        hidden: 3584,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        ffn: 18944,
        vocab: 152_064,
        rope_theta: 1_000_000.0,
        norm_eps: 1e-6,
        tied: false,
        qkv_bias: true,
        context_length: 131_072,
        sliding_window: None,
    },
    NamedShape {
        name: "gemma3-1b",
        family: Family::Gemma3,
        hidden: 1152,
        layers: 26,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        ffn: 6912,
        vocab: 262_144,
        rope_theta: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        qkv_bias: false,
        context_length: 32768,
        sliding_window: Some(512),
    },
    NamedShape {
        name: "mistral-7b",
        family: Family::Mistral,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        ffn: 14336,
        vocab: 32000,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        qkv_bias: false,
        context_length: 32768,
        sliding_window: Some(4096),
    },
];

/// The names `--shape` accepts besides `custom`.
pub fn shape_names() -> Vec<&'static str> {
    NAMED_SHAPES.iter().map(|s| s.name).collect()
}

impl Shape {
    /// A named shape from the table.
    pub fn named(name: &str) -> Result<Self, SynthError> {
        let s = NAMED_SHAPES
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| SynthError::UnknownShape {
                name: name.to_string(),
                known: shape_names().join(", "),
            })?;
        Ok(Shape {
            name: s.name.to_string(),
            family: s.family,
            hidden: s.hidden,
            layers: s.layers,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            ffn: s.ffn,
            vocab: s.vocab,
            rope_theta: s.rope_theta,
            norm_eps: s.norm_eps,
            tied: s.tied,
            qkv_bias: s.qkv_bias,
            context_length: s.context_length,
            sliding_window: s.sliding_window,
        })
    }

    /// Checks the dimensions (and that `dtype`'s blocks fit the rows), naming the flag to fix.
    pub fn validate(&self, dtype: WeightType) -> Result<(), SynthError> {
        let bad = |msg: String| Err(SynthError::InvalidShape(msg));
        for (flag, v) in [
            ("--hidden", self.hidden),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--kv-heads", self.kv_heads),
            ("--head-dim", self.head_dim),
            ("--ffn", self.ffn),
            ("--vocab", self.vocab),
        ] {
            if v == 0 {
                return bad(format!("{flag} 0: every dimension must be at least 1"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "--kv-heads {} must divide --heads {} (grouped-query attention)",
                self.kv_heads, self.heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head size {} is odd: rotary embeddings need an even one (--head-dim, or --hidden / --heads)",
                self.head_dim
            ));
        }
        // Every matrix row is one of these lengths; a block type needs whole blocks.
        let block = dtype.min_block();
        for (what, cols) in [
            ("--hidden", self.hidden),
            ("--ffn", self.ffn),
            ("--heads × head size", self.heads * self.head_dim),
        ] {
            if !cols.is_multiple_of(block) {
                return bad(format!(
                    "{what} = {cols} is not a multiple of {block}, the block size of --type {dtype}; pick a multiple of {block} or a float type"
                ));
            }
        }
        Ok(())
    }

    /// Parameters (the embedding table counted once when tied).
    pub fn parameters(&self) -> u64 {
        tensor_plan(self)
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_are_consistent() {
        for name in shape_names() {
            let s = Shape::named(name).unwrap();
            s.validate(WeightType::Q4KM).unwrap();
            assert_eq!(s.heads % s.kv_heads, 0, "{name}");
        }
        let l8 = Shape::named("llama3.1-8b").unwrap();
        // 8.03 B parameters with Llama 3's vocabulary.
        assert!(
            (8.0e9..8.1e9).contains(&(l8.parameters() as f64)),
            "{}",
            l8.parameters()
        );
        let l1 = Shape::named("llama3.2-1b").unwrap();
        assert!((1.23e9..1.25e9).contains(&(l1.parameters() as f64)));
        assert!(Shape::named("gpt-9")
            .unwrap_err()
            .to_string()
            .contains("llama3.2-1b"));
    }
}
