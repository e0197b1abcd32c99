#!/usr/bin/env bash
# The GPU measurements of issue 11, as one script for a short loan of a GPU machine: SmolLM2
# Q4_1 on all of WikiText-2 at ctx 512 on the GPU (f32 and native), the same run again (same
# bits?), another batch size (how far it moves), the CPU f32 figure to compare with, tokens/s
# and peak GPU memory (nvidia-smi, sampled every 0.2 s). Writes everything under $OUT (or
# ./gpu-check) and prints a summary.
#
# Needs a `--features cuda` build of ppl (PPL: path, default ./target/release/ppl) runnable on
# that machine, the model (MODEL, default from `ppl fetch-model`'s cache) and the text (DATA).
# The CPU reference: CPU_PPL (the figure, e.g. from the README's "Measured" section for all
# chunks), or CPU_RESULTS (a results.json of `ppl eval --precision f32` over the same chunks),
# else computed here on the CPU (about 20 minutes on 2 cores for all of WikiText-2).
# A GPU machine without Rust or network gets a prebuilt bundle instead: scripts/gpu-bundle.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ppl=${PPL:-./target/release/ppl}
out=${OUT:-./gpu-check}
model=${MODEL:-$($ppl fetch-model)}
data=${DATA:-../shared/data/wikitext-2-raw/wiki.test.raw}
chunks=${CHUNKS:-}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.csv"

limit=()
[ -n "$chunks" ] && limit=(--chunks "$chunks")
run() { # name, extra args...
  local name=$1
  shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/$name.mem" &
  local smi=$!
  "$ppl" eval --model "$model" --data "$data" --ctx 512 "${limit[@]}" --progress none --quiet \
    --output "$out/$name.json" "$@" 2>"$out/$name.log" || echo "$name failed: see $out/$name.log"
  kill "$smi" 2>/dev/null || true
}

run f32-b1 --device cuda:0 --precision f32 --batch-size 1
run f32-b1-again --device cuda:0 --precision f32 --batch-size 1
run f32-b8 --device cuda:0 --precision f32 --batch-size 8
run native-b8 --device cuda:0 --precision native --batch-size 8
run bf16-b8 --device cuda:0 --precision bf16 --batch-size 8
cpu=${CPU_RESULTS:-}
if [ -n "${CPU_PPL:-}" ]; then
  echo "{\"ppl\": $CPU_PPL, \"tokens\": \"(given)\"}" >"$out/cpu-given.json"
  cpu=$out/cpu-given.json
elif [ -z "$cpu" ]; then
  "$ppl" eval --model "$model" --data "$data" --ctx 512 "${limit[@]}" --precision f32 \
    --progress none --quiet --output "$out/cpu-f32.json"
  cpu=$out/cpu-f32.json
fi

python3 - "$out" "$cpu" <<'PY'
import json, sys, os
out, cpu_path = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
cpu = json.load(open(cpu_path))
print(f"CPU f32: PPL {cpu['ppl']:.6f} over {cpu['tokens']} tokens")
for name in ["f32-b1", "f32-b1-again", "f32-b8", "native-b8", "bf16-b8"]:
    r = load(name)
    if r is None:
        print(f"{name}: failed")
        continue
    mem = [int(x) for x in open(os.path.join(out, name + ".mem")).read().split() if x.isdigit()]
    rel = (r["ppl"] - cpu["ppl"]) / cpu["ppl"]
    print(f"{name}: PPL {r['ppl']:.6f} ({rel:+.2e} vs CPU f32), "
          f"{r['timings']['tokens_per_s']:.0f} tokens/s, peak GPU memory {max(mem or [0])} MiB, "
          f"determinism {r.get('determinism')}")
a, b, c = load("f32-b1"), load("f32-b1-again"), load("f32-b8")
if a and b:
    same = a["accumulator"] == b["accumulator"]
    print("same batch size, run to run:", "bit-identical" if same else
          f"differs: {a['nll_sum']!r} vs {b['nll_sum']!r}")
if a and c:
    print("batch size 1 vs 8:", "bit-identical" if a["accumulator"] == c["accumulator"] else
          f"relative drift {(c['nll_sum'] - a['nll_sum']) / a['nll_sum']:+.2e}")
PY
