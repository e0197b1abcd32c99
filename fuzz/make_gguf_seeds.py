#!/usr/bin/env python3
"""Writes the `gguf` fuzz target's seeds into fuzz/seeds/gguf/: tiny but complete GGUF v3
models (a 1-layer Llama of hidden size 8 with an 8-token BPE vocabulary, in F32 and in Q8_0,
and a header with metadata only), so the fuzzer starts from inputs that reach every stage of
the reader. Deterministic: the same bytes on every run.

    python3 fuzz/make_gguf_seeds.py
"""
import os
import struct

U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10
GGML_F32, GGML_Q8_0 = 0, 8
ALIGN = 32


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, kind, value):
    out = s(key) + struct.pack("<I", kind)
    if kind == U32:
        return out + struct.pack("<I", value)
    if kind == I32:
        return out + struct.pack("<i", value)
    if kind == F32:
        return out + struct.pack("<f", value)
    if kind == STRING:
        return out + s(value)
    if kind == ARRAY:
        elem, items = value
        body = struct.pack("<IQ", elem, len(items))
        for it in items:
            body += s(it) if elem == STRING else struct.pack("<i", it)
        return out + body
    raise ValueError(kind)


def q8_0_rows(values, cols):
    """Q8_0 blocks (f16 scale, 32 int8) of `values`, row-major with `cols` per row."""
    out = b""
    for start in range(0, len(values), 32):
        block = values[start:start + 32]
        amax = max(abs(v) for v in block)
        d = amax / 127 if amax else 0.0
        qs = [int(round(v / d)) if d else 0 for v in block]
        out += struct.pack("<e", d) + struct.pack("<32b", *qs)
    return out


def model(ggml_type, with_tensors=True):
    hidden, ff, vocab, heads = 32, 64, 8, 2
    tokens = ["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"]
    meta = [
        kv("general.architecture", STRING, "llama"),
        kv("general.alignment", U32, ALIGN),
        kv("llama.block_count", U32, 1),
        kv("llama.context_length", U32, 64),
        kv("llama.embedding_length", U32, hidden),
        kv("llama.feed_forward_length", U32, ff),
        kv("llama.attention.head_count", U32, heads),
        kv("llama.attention.head_count_kv", U32, heads),
        kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv("llama.rope.freq_base", F32, 10000.0),
        kv("tokenizer.ggml.model", STRING, "gpt2"),
        kv("tokenizer.ggml.pre", STRING, "smollm"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        kv("tokenizer.ggml.token_type", ARRAY, (I32, [1] * 6 + [3, 3])),
        kv("tokenizer.ggml.merges", ARRAY, (STRING, ["a b", "c d"])),
        kv("tokenizer.ggml.bos_token_id", U32, 6),
        kv("tokenizer.ggml.eos_token_id", U32, 7),
    ]
    shapes = [
        ("token_embd.weight", [hidden, vocab]),
        ("blk.0.attn_norm.weight", [hidden]),
        ("blk.0.attn_q.weight", [hidden, hidden]),
        ("blk.0.attn_k.weight", [hidden, hidden]),
        ("blk.0.attn_v.weight", [hidden, hidden]),
        ("blk.0.attn_output.weight", [hidden, hidden]),
        ("blk.0.ffn_norm.weight", [hidden]),
        ("blk.0.ffn_gate.weight", [hidden, ff]),
        ("blk.0.ffn_up.weight", [hidden, ff]),
        ("blk.0.ffn_down.weight", [ff, hidden]),
        ("output_norm.weight", [hidden]),
    ] if with_tensors else []
    infos, data = b"", b""
    for i, (name, dims) in enumerate(shapes):
        n = 1
        for d in dims:
            n *= d
        # Deterministic small values; norms are ones.
        values = [1.0] * n if len(dims) == 1 else [((j * 7 + i * 3) % 17 - 8) / 64 for j in range(n)]
        kind = ggml_type if len(dims) == 2 else GGML_F32
        body = q8_0_rows(values, dims[0]) if kind == GGML_Q8_0 else struct.pack(f"<{n}f", *values)
        data += b"\0" * (-len(data) % ALIGN)
        infos += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", kind, len(data))
        data += body
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(meta)) + b"".join(meta) + infos
    return head + b"\0" * (-len(head) % ALIGN) + data


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "gguf")
    os.makedirs(out, exist_ok=True)
    for name, blob in [
        ("tiny-llama-f32.gguf", model(GGML_F32)),
        ("tiny-llama-q8_0.gguf", model(GGML_Q8_0)),
        ("metadata-only.gguf", model(GGML_F32, with_tensors=False)),
    ]:
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
        print(f"{name}: {len(blob)} bytes")


if __name__ == "__main__":
    main()
