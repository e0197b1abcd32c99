#!/usr/bin/env python3
"""Writes the tiny random Hugging Face checkpoints in tests/fixtures/tiny/ and the logits
`transformers` computes for them (the reference tests/hf.rs checks ppl against).

Each checkpoint exercises what its architecture adds to Llama: Llama itself (Q/K rows that
ppl reorders for its rotary layout), Mistral (a sliding window shorter than the sequence),
Qwen2 (Q/K/V biases), Qwen3 (per-head Q/K RMSNorm, a head size that is not hidden/heads,
an untied output layer), Gemma 3 (norms stored as w for 1 + w, post-norms, GELU, local and
global layers with their own RoPE bases and a window shorter than the sequence, a query
scale other than 1/sqrt(head_dim)), Llama with rotary scaling as configured (Llama 3.x's
`llama3` frequency-dependent scaling and `linear`, both with an original context shorter than
the sequence, so the scaled frequencies decide the logits). Weights are drawn wide (norm weights and biases too) so that the
logits are far from uniform; the reference runs in float64.

Needs torch and transformers (pip install torch transformers); run from the repository root:
    python3 scripts/tiny-checkpoints.py [NAME ...]     (default: every model)
"""

import json
import pathlib
import sys

import torch
import transformers

OUT = pathlib.Path("tests/fixtures/tiny")
IDS = [[1, 17, 99, 42, 3, 64, 127, 5, 88, 23, 23, 23, 70, 11, 0, 45, 100, 2, 9, 31, 77, 54, 120, 8]]

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)

MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=True)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(sliding_window=8, tie_word_embeddings=False, head_dim=16)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True, use_sliding_window=False)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=False, head_dim=32)),
    # Local (window 8), global, local layers; a query scale that is not 1/sqrt(head_dim).
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(num_hidden_layers=3, head_dim=16, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    query_pre_attn_scalar=24, rope_local_base_freq=100.0,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
    # Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth blend between;
    # the original context (8) is a third of the sequence.
    "llama-rope-llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                          dict(tie_word_embeddings=True, rope_parameters=dict(
                              rope_type="llama3", rope_theta=10000.0, factor=4.0,
                              low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=8))),
    "llama-rope-linear": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                          dict(tie_word_embeddings=False, rope_parameters=dict(
                              rope_type="linear", rope_theta=500.0, factor=2.5))),
}


def main():
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        config_cls, model_cls, extra = MODELS[name]
        torch.manual_seed(sum(map(ord, name)))
        config = config_cls(**{**COMMON, **extra})
        config._attn_implementation = "eager"
        model = model_cls(config).to(torch.float32).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.copy_(0.3 * torch.randn_like(p))
        out = OUT / name
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        model = model.to(torch.float64)
        with torch.no_grad():
            logits = model(torch.tensor(IDS)).logits[0]
        (out / "expected.json").write_text(json.dumps({
            "ids": IDS[0],
            "logits": [[round(float(x), 10) for x in row] for row in logits],
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }))
        print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
