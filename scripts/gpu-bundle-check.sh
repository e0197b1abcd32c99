#!/usr/bin/env bash
# The CPU-side checks of the CUDA bundle (scripts/gpu-bundle.sh), as CI (.ci/run) runs them
# and as anyone can on a machine without a GPU:
#
#   scripts/gpu-bundle-check.sh [OUTDIR]       # OUTDIR kept if given, else a temporary one
#
# 1. Makes the bundle, the link included (gpu-bundle.sh: it fails on a missing soname, a
#    shipped stub or a size over 60 MiB).
# 2. Runs the bundled binary on the CPU: its --device cpu results must have the bits of the
#    bundled CPU results of the normal build (ppl, nll_sum and the exact accumulator equal),
#    at another batch size (4), for the F16 model in f32 and the Q8_0 model in native. It
#    loads the PyPI CUDA libraries and, as libcuda.so.1, the link-only driver stub (which
#    answers every call with CUDA_ERROR_STUB_LIBRARY); that is how it can start here at all.
# 3. --device cuda with that stub: a clear "no CUDA driver or device" error, exit 1, no panic.
# 4. The bundle's run.sh on this machine (no NVIDIA driver): it stops at once (exit 3) with
#    "no NVIDIA driver", without trying a run.
#
# CI sets PPL_BUNDLE_TARGET_DIR=target and PPL_BUNDLE_NVCC_FLAGS="-Xcicc -O0 -Xptxas -O0 -O0"
# (as its CUDA clippy: candle's kernel build is then shared, and never optimised for a run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
libs=${PPL_CUDA_LIBS:-$HOME/.cache/ppl/cuda-13.0-libs}
link=${PPL_CUDA_LINK:-$HOME/.cache/ppl/cuda-13.0-link}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
outdir=${1:-$work/bundle}
fail() {
  echo "gpu-bundle-check: FAILED: $*" >&2
  exit 1
}

t0=$(date +%s)
bash scripts/gpu-bundle.sh "$outdir"
echo "gpu-bundle-check: bundle made in $(($(date +%s) - t0)) s"

# The stub under the driver's soname, in a directory of its own: only this check loads it.
mkdir -p "$work/driver-stub"
ln -s "$link/lib/stubs/libcuda.so" "$work/driver-stub/libcuda.so.1"
# The CUDA libraries the bundle linked (PyPI: cuBLAS, cuRAND, NCCL, the runtime), where the
# link names point.
stub_path=$work/driver-stub
for lib in "$link"/lib/lib*.so; do
  stub_path=$stub_path:$(dirname "$(readlink -f "$lib")")
done

same_bits() { # bundled-binary results, CPU results
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
diff = [k for k in ("ppl", "nll_sum", "tokens", "accumulator") if a[k] != b[k]]
if diff:
    sys.exit(f"{sys.argv[1]} vs {sys.argv[2]}: {', '.join(f'{k} {a[k]!r} != {b[k]!r}' for k in diff)}")
print(f"  identical bits: PPL {a['ppl']!r}, NLL sum {a['nll_sum']!r}, {a['tokens']} tokens")
PY
}
xz -dc "$outdir/ppl.xz" >"$work/ppl"
chmod +x "$work/ppl"
for run in "tiny-f16 f32" "tiny-q8_0 native"; do
  read -r model precision <<<"$run"
  echo "gpu-bundle-check: bundled binary, --device cpu, $model $precision, batch size 4"
  LD_LIBRARY_PATH=$stub_path "$work/ppl" eval --model "$outdir/models/$model.gguf" \
    --data "$outdir/data.txt" --ctx 512 --precision "$precision" --batch-size 4 --device cpu \
    --progress none --quiet --output "$work/$model-$precision.json" ||
    fail "the bundled binary failed on the CPU ($model, $precision)"
  same_bits "$work/$model-$precision.json" "$outdir/cpu/$model-$precision.json" ||
    fail "the bundled binary's CPU bits differ from the normal build's ($model, $precision)"
done

echo "gpu-bundle-check: bundled binary, --device cuda, with the driver stub"
rc=0
LD_LIBRARY_PATH=$stub_path "$work/ppl" eval --model "$outdir/models/tiny-q8_0.gguf" \
  --data "$outdir/data.txt" --ctx 512 --device cuda --progress none --quiet \
  --output "$work/cuda.json" >"$work/cuda.log" 2>&1 || rc=$?
sed 's/^/  /' "$work/cuda.log"
[ "$rc" -eq 1 ] || fail "--device cuda without a driver: exit $rc, expected 1 (an error, not a crash)"
grep -q "no CUDA driver or device" "$work/cuda.log" || fail "--device cuda without a driver: not the 'no CUDA driver or device' error"
if grep -q "panicked" "$work/cuda.log"; then fail "--device cuda without a driver panicked"; fi

echo "gpu-bundle-check: run.sh on this machine (no NVIDIA driver), the PyPI libraries found"
rc=0
PYTHONPATH=$libs OUT=$work/run-here timeout 60 bash "$outdir/run.sh" >"$work/run.log" 2>&1 || rc=$?
sed 's/^/  /' "$work/run.log"
[ "$rc" -eq 3 ] || fail "run.sh without a driver: exit $rc, expected 3"
grep -q "no NVIDIA driver" "$work/run.log" || fail "run.sh without a driver: not the 'no NVIDIA driver' message"
ls "$work/run-here"/*.json >/dev/null 2>&1 && fail "run.sh without a driver tried runs"
echo "gpu-bundle-check: all checks passed ($(($(date +%s) - t0)) s in all); bundle: $(du -sh "$outdir" | cut -f1)"
