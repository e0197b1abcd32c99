//! Helpers shared by unit tests.

use crate::model::{Arch, LlamaConfig};

/// A benchmark's count from the environment variable `name` (`PPL_BENCH_REPS`,
/// `PPL_BENCH_THREADS`): `default` when unset; a value that is not a whole number of at least
/// 1 stops the benchmark with a message naming the variable, rather than running with a
/// count nobody asked for.
pub fn bench_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => panic!(
                "{name}='{v}' is not a whole number of at least 1: unset it or give e.g. {default}"
            ),
        },
    }
}

/// `n` reproducible pseudo-random values, uniform in `[-scale/2, scale/2)` (an LCG: the same
/// values on every machine).
pub fn uniform(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

/// The shape of [`tiny_llama`]: two layers, hidden 64, 4 heads, 2 KV heads, 100 tokens.
pub fn tiny_shape() -> crate::model::synth::Shape {
    use crate::model::synth::{Family, Shape};
    Shape {
        name: "custom".into(),
        family: Family::Llama,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 128,
        vocab: 100,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        context_length: 256,
        sliding_window: None,
    }
}

/// A two-layer Llama of random f32 weights (hidden 64, 4 heads, 2 KV heads, 100 tokens),
/// written into `dir` by the synthesiser and loaded whole on the CPU.
pub fn tiny_llama(dir: &std::path::Path) -> crate::model::Llama {
    use crate::model::gguf::{tests::build_gguf, Value};
    use crate::model::synth::{Synth, WeightType};
    let tokens = Value::Array((0..100).map(|i| Value::String(format!("t{i}"))).collect());
    let tokenizer = dir.join("tokenizer.gguf");
    let kv = [
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", tokens),
    ];
    std::fs::write(
        &tokenizer,
        build_gguf(&kv, &[("w", vec![2], vec![0.0, 1.0])]),
    )
    .unwrap();
    let tokenizer = crate::model::GgufFile::open(&tokenizer).unwrap();
    let shape = tiny_shape();
    let model = dir.join("tiny.gguf");
    Synth::new(shape, WeightType::F32, 7, &tokenizer)
        .unwrap()
        .write_gguf(&model, &mut |_, _, _| {})
        .unwrap();
    let g = crate::model::GgufFile::open(&model).unwrap();
    crate::model::Llama::load(
        &g,
        crate::model::Precision::F32,
        &crate::model::Partition::full(2),
        None,
        &candle_core::Device::Cpu,
    )
    .unwrap()
}

/// A small model of `arch` with every optional tensor its family has (and a Llama with an
/// output bias).
pub fn tiny_config(arch: Arch) -> LlamaConfig {
    LlamaConfig {
        arch,
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        context_length: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_dim: 8,
        tied_embeddings: true,
        rope_neox: arch.rope_neox(),
        attn_bias: arch == Arch::Qwen2,
        attn_output_bias: arch == Arch::Llama,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        sliding_window: None,
        local_layers: Vec::new(),
        rope_theta_local: 10000.0,
        attention_scale: None,
        norm_weight_plus_one: false,
    }
}
