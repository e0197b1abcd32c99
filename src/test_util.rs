//! Helpers shared by unit tests.

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

/// A two-layer Llama of random f32 weights (hidden 64, 4 heads, 2 KV heads, 100 tokens),
/// written into `dir` by the synthesiser and loaded whole on the CPU.
pub fn tiny_llama(dir: &std::path::Path) -> crate::model::Llama {
    use crate::model::gguf::{tests::build_gguf, Value};
    use crate::model::synth::{Family, Shape, Synth, WeightType};
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
    let shape = Shape {
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
    };
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
