#!/usr/bin/env bash
# Quantization schemes against the float base, as in the README's table: the base's final hidden
# states are saved once (`--save-base`), then each variant is compared against them
# (`--base-logits`: only the base's output layer is loaded again).
#
#   scripts/quantize-table.sh [CHUNKS] [CTX] [OUTDIR]        (defaults: 40 chunks, ctx 512)
#
# The base is the Q4_1 file's weights dequantized to f32 (`--base-precision f32`, the same
# values as `ppl export --dtype f32` writes). Variants are quantized at load from those f32
# values and run in `native` precision (GGUF types through their quantized matmul, 8-bit
# activations, as llama.cpp; int4/int8 as their dequantized values with f32 activations).
# GGUF types keep the embedding and output as stored (Q8_0), as llama-quantize does for this
# model; int4/int8 quantize the output layer too (torchao's default); q4_k_m is llama.cpp's
# per-tensor mix.
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNKS=${1:-40}
CTX=${2:-512}
OUT=${3:-$(mktemp -d)}
mkdir -p "$OUT"
PPL=${PPL_BIN:-./target/release/ppl}
MODEL=${PPL_MODEL:-$($PPL fetch-model)}
DATA=${PPL_DATA:-../shared/data/wikitext-2-raw/wiki.test.raw}
common=(compare --model "$MODEL" --data "$DATA" --ctx "$CTX" --chunks "$CHUNKS" --progress none --quiet)

# Results already in OUTDIR are kept (a rerun finishes an interrupted table).
# The original Q4_1 file against its f32 values; saves the base for the others.
if [ ! -f "$OUT/q4_1-file.json" ] || [ ! -f "$OUT/base.pplbase" ]; then
  "$PPL" "${common[@]}" --base "$MODEL" --save-base "$OUT/base.pplbase" --output "$OUT/q4_1-file.json"
fi
variant() { # name flags...
  local name=$1
  shift
  [ -f "$OUT/$name.json" ] && return 0
  "$PPL" "${common[@]}" --base-logits "$OUT/base.pplbase" "$@" --output "$OUT/$name.json"
}
for g in 32 64 128 256; do variant "int4-g$g" --quantize int4 --group-size "$g"; done
variant int8 --quantize int8
for t in q4_0 q8_0 q4_k; do variant "$t" --quantize "$t" --quantize-skip embeddings,output; done
# llama.cpp's mix, output included (its Q6_K falls back to Q8_0 for rows of 576, as stored).
variant q4_k_m --quantize q4_k_m --quantize-skip none

python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| variant | PPL | ΔPPL ± err | mean KLD ± err | KLD median | KLD 99% | same top % | seconds |")
print("|---|---|---|---|---|---|---|---|")
for name in ["q4_1-file", "int4-g32", "int4-g64", "int4-g128", "int4-g256", "int8", "q4_0", "q8_0", "q4_k", "q4_k_m"]:
    f = out / f"{name}.json"
    if not f.exists():
        continue
    r = json.loads(f.read_text())
    k = r["kld_percentiles"]
    print(f"| {name} | {r['ppl_model']:.4f} | {r['delta_ppl']:+.4f} ± {r['delta_ppl_err']:.4f} | "
          f"{r['kld_mean']:.6f} ± {r['kld_mean_err']:.6f} | {k['median']:.6f} | {k['p99']:.6f} | "
          f"{r['same_top']:.2f} ± {r['same_top_err']:.2f} | {r['seconds']:.0f} |")
r = json.loads((out / "q4_1-file.json").read_text())
print(f"\nbase (f32): PPL {r['ppl_base']:.4f} ± {r['ppl_base_err']:.4f}, {r['summary_tokens'] if 'summary_tokens' in r else r['tokens']} tokens; "
      f"base file {r['base_file']['bytes'] / 1e6:.1f} MB")
PY
