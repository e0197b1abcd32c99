#!/usr/bin/env bash
# The GPU checks of a bundle made by scripts/gpu-bundle.sh (this file is its run.sh), for a
# short loan of a GPU machine: no Rust, no network, a python3 with the CUDA 13 PyPI libraries.
#
#   OUT=/some/dir bash run.sh          # PYTHON=/path/to/python3 if not the one on PATH
#
# 1. Finds the CUDA libraries of that python (the nvidia.* packages' lib/ directories) for
#    LD_LIBRARY_PATH, and checks that every library the binary needs loads; without the NVIDIA
#    driver (libcuda.so.1) or a GPU (nvidia-smi) it stops at once with the reason, exit 3.
# 2. Prints nvidia-smi, then does the runs of runs.tsv on GPU 0 (f32 and native twice each
#    for the run-to-run bits, batch size 16, bf16), each cut at RUN_LIMIT_S (120 s), all
#    within TOTAL_LIMIT_S (480 s), sampling GPU memory every 0.2 s.
# 3. Writes everything under $OUT (default ./results next to this script): each run's
#    results.json, log and memory samples, and summary.txt, the one-screen summary printed
#    at the end: PPL against the bundled CPU results (goals: f32 within 1e-5 relative, native
#    within 1e-3), run-to-run bits, batch size 1 vs 16, tokens/s, peak GPU memory. Exit 0
#    when every run finished and met its goal, 1 otherwise.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
# DEVICE: cuda:0; another value (cpu) only to try this script on a machine without a GPU.
device=${DEVICE:-cuda:0}
run_limit=${RUN_LIMIT_S:-120}
total_limit=${TOTAL_LIMIT_S:-480}

stop() { # exit status, message
  echo "run.sh: $2" | tee "$out/summary.txt" >&2
  exit "$1"
}
[ -f "$here/ppl.xz" ] || stop 2 "no ppl.xz next to this script ($here): is this a bundle from scripts/gpu-bundle.sh?"
# The binary travels xz-compressed; unpacked (python's lzma: no xz needed) into a temporary
# directory, not under $OUT (85 MB that need not come back).
bin_dir=$(mktemp -d)
trap 'rm -rf "$bin_dir"' EXIT
ppl=$bin_dir/ppl
"$py" -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.decompress(open(sys.argv[1], "rb").read()))' \
  "$here/ppl.xz" "$ppl" || stop 2 "cannot unpack $here/ppl.xz with $py"
chmod +x "$ppl"

# -- The libraries: every lib/ directory under the python's nvidia.* packages (cu13/lib for
# cuBLAS, cuRAND, NVRTC and the runtime, nccl/lib for NCCL).
libdirs=$("$py" - <<'PY' 2>/dev/null
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
dirs = []
for base in nvidia.__path__:
    for dirpath, _, files in os.walk(base):
        if os.path.basename(dirpath) == "lib" and any(".so" in f for f in files):
            dirs.append(dirpath)
print(":".join(sorted(set(dirs))))
PY
)
echo "CUDA libraries from $py: ${libdirs:-none found (no nvidia.* packages)}" | tee "$out/libraries.txt"
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(ldd "$ppl" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
ldd "$ppl" >>"$out/libraries.txt" 2>&1
if [ -n "$missing" ]; then
  case " $missing" in
  *" libcuda.so.1 "*)
    stop 3 "no NVIDIA driver: libcuda.so.1 is not on this machine, so no GPU can be used (missing: $missing). Run the bundle on a machine with an NVIDIA GPU and its driver." ;;
  *)
    stop 3 "missing CUDA libraries: $missing. Install the PyPI packages nvidia-cublas, nvidia-curand, nvidia-cuda-nvrtc, nvidia-cuda-runtime and nvidia-nccl-cu13 (CUDA 13) into $py, or name another python with PYTHON=." ;;
  esac
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  stop 3 "no nvidia-smi: no NVIDIA driver is installed on this machine"
fi
if ! timeout 30 nvidia-smi >"$out/nvidia-smi.txt" 2>&1; then
  cat "$out/nvidia-smi.txt" >&2
  stop 3 "nvidia-smi failed (no GPU or no driver; its output is above)"
fi
cat "$out/nvidia-smi.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >"$out/gpu.csv" 2>&1

# -- The runs.
start=$(date +%s)
while IFS=$'\t' read -r name model precision batch; do
  [ -n "$name" ] || continue
  if [ $(($(date +%s) - start)) -ge "$total_limit" ]; then
    echo "$name: skipped (over ${total_limit} s in all)" | tee "$out/$name.log"
    continue
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 >"$out/$name.mem" 2>/dev/null &
  smi=$!
  t0=$(date +%s%N)
  timeout -k 10 "$run_limit" "$ppl" eval --model "$here/models/$model.gguf" --data "$here/data.txt" \
    --ctx 512 --device "$device" --precision "$precision" --batch-size "$batch" --progress none \
    --quiet --output "$out/$name.json" >"$out/$name.log" 2>&1
  rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  echo "$name: exit $rc after $((($(date +%s%N) - t0) / 1000000)) ms" | tee -a "$out/$name.log"
  [ "$rc" -eq 124 ] && echo "$name: cut at ${run_limit} s" | tee -a "$out/$name.log"
done <"$here/runs.tsv"

# -- The summary.
"$py" - "$here" "$out" <<'PY' | tee "$out/summary.txt"
import csv, json, os, sys

here, out = sys.argv[1], sys.argv[2]
GOALS = {"f32": 1e-5, "native": 1e-3}
runs = [r for r in csv.reader(open(os.path.join(here, "runs.tsv")), delimiter="\t") if r]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
gpu = open(os.path.join(out, "gpu.csv")).read().strip().splitlines()
print("GPU:", gpu[-1] if gpu else "?")
ok = True
results = {}
# Random weights give nearly uniform predictions (PPL near the vocabulary size), so PPL moves
# little whatever the arithmetic: the largest per-window change of the mean NLL (nats) is the
# finer comparison.
def window_drift(r, cpu):
    pairs = zip(r.get("windows", []), cpu.get("windows", []))
    return max((abs(a["nll_sum"] / a["tokens"] - b["nll_sum"] / b["tokens"])
                for a, b in pairs if a["tokens"] and b["tokens"]), default=float("nan"))
print(f"{'run':<22}{'PPL':>14}{'vs CPU':>11}{'goal':>7}{'win dNLL':>10}{'tokens/s':>10}{'peak MiB':>9}")
for name, model, precision, batch in runs:
    r = load(os.path.join(out, name + ".json"))
    results[name] = r
    if r is None:
        log = open(os.path.join(out, name + ".log")).read().strip().splitlines() or ["?"]
        if "skipped" in log[-1]:
            print(f"{name:<22} SKIPPED (time limit)")
        else:  # the log's last line is the exit status; the one before, ppl's error
            print(f"{name:<22} FAILED: {log[-2] if len(log) > 1 else log[-1]}"[:160])
        ok = False
        continue
    cpu = load(os.path.join(here, "cpu", f"{model}-{precision}.json"))
    rel = (r["ppl"] - cpu["ppl"]) / cpu["ppl"]
    goal = GOALS.get(precision)
    met = goal is None or abs(rel) <= goal
    ok &= met
    mem = [int(x) for x in open(os.path.join(out, name + ".mem")).read().split() if x.isdigit()]
    print(f"{name:<22}{r['ppl']:>14.6f}{rel:>+11.2e}{(('ok' if met else 'MISS') if goal else '-'):>7}"
          f"{window_drift(r, cpu):>10.1e}{r['timings']['tokens_per_s']:>10.0f}{max(mem or [0]):>9}")
def same(a, b, what):
    ra, rb = results.get(a), results.get(b)
    if ra is None or rb is None:
        print(f"{what}: not measured")
        return
    if ra["accumulator"] == rb["accumulator"]:
        print(f"{what}: bit-identical")
    else:
        print(f"{what}: DIFFERS, NLL sums {ra['nll_sum']!r} vs {rb['nll_sum']!r} "
              f"({(rb['nll_sum'] - ra['nll_sum']) / ra['nll_sum']:+.2e})")
for a in [n for n, *_ in runs if n + "-again" in results]:
    same(a, a + "-again", f"run to run, {a}")
same("f16-f32-b1", "f16-f32-b16", "batch size 1 vs 16, f16-f32")
same("q8-native-b1", "q8-native-b16", "batch size 1 vs 16, q8-native")
first = next((r for r in results.values() if r), None)
if first:
    print("determinism field:", json.dumps(first.get("determinism")))
print("RESULT:", "all runs finished within their goals" if ok else "a run failed or missed its goal")
sys.exit(0 if ok else 1)
PY
