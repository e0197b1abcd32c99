#!/usr/bin/env bash
# Makes a CUDA bundle on a machine without a GPU or CUDA toolkit, for a short loan of a GPU
# machine that has the NVIDIA driver and the CUDA 13 libraries (PyPI) but no Rust and no
# network:
#
#   scripts/gpu-bundle.sh OUTDIR      # then carry OUTDIR there and run: bash OUTDIR/run.sh
#
# OUTDIR gets: ppl.xz (built with --features cuda,nccl for compute capability 90, stripped),
# models/ (two random-weight Llamas with SmolLM2's tokenizer, F16 and Q8_0), data.txt (the
# start of WikiText-2's test text), runs.tsv (the runs run.sh does), cpu/ (the CPU results of
# those runs, computed here by the normal build), run.sh and README.txt. At most 60 MiB, or
# the script fails.
#
# The link: candle's cudarc links the CUDA libraries dynamically (-lcuda -lnccl -lnvrtc
# -lcurand -lcublas -lcublasLt). They come from PyPI (pinned CUDA 13.0 versions, the oldest
# CUDA 13 ones, so any CUDA 13 machine has at least their symbols) into PPL_CUDA_LIBS; their
# unversioned link names and a driver stub go to PPL_CUDA_LINK, which the build names as
# CUDA_ROOT (a root cudarc's build script searches, lib/ and lib/stubs/ as in a toolkit). The
# stub, a libcuda.so with soname libcuda.so.1, exports every driver function the compiled code
# calls (read from the rlibs with nm) and makes each return CUDA_ERROR_STUB_LIBRARY. It only
# satisfies the linker: the binary records the real sonames, and the GPU machine's driver and
# libraries are what it loads. The stub is never put into OUTDIR.
#
# Environment:
#   PPL_BUNDLE_TARGET_DIR  cargo target dir of the CUDA build (default target/cuda-bundle, so
#                          the normal target/ is not rebuilt for other features)
#   PPL_BUNDLE_NVCC_FLAGS  NVCC_APPEND_FLAGS of the kernel build (default: none, optimised).
#                          CI gives "-Xcicc -O0 -Xptxas -O0 -O0" (it never runs the device
#                          code). candle's kernel build does not track this variable, so a
#                          target dir must not mix settings: the script records the flags it
#                          built with there and refuses another setting.
#   PPL_CPU_BIN            the normal CPU build that writes the models and the CPU results
#                          (default target/release/ppl)
#   DATA                   the text (default ../shared/data/wikitext-2-raw/wiki.test.raw)
#   PPL_BUNDLE_DATA_BYTES  how much of it (default 60000: 29 windows of 512, 7395 tokens scored)
#   PPL_CUDA_LIBS, PPL_CUDA_LINK  caches (default ~/.cache/ppl/cuda-13.0-libs, -link)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu-bundle.sh OUTDIR (a new or empty directory)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
outdir=$1
if [ -e "$outdir" ] && [ -n "$(ls -A "$outdir")" ]; then
  echo "gpu-bundle: $outdir is not empty; give a new or empty directory" >&2
  exit 2
fi
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
cd "$root"

max_bytes=$((60 * 1024 * 1024))
target=${PPL_BUNDLE_TARGET_DIR:-$root/target/cuda-bundle}
nvcc_flags=${PPL_BUNDLE_NVCC_FLAGS:-}
cpu_ppl=${PPL_CPU_BIN:-$root/target/release/ppl}
data_src=${DATA:-$root/../shared/data/wikitext-2-raw/wiki.test.raw}
data_bytes=${PPL_BUNDLE_DATA_BYTES:-60000}
libs=${PPL_CUDA_LIBS:-$HOME/.cache/ppl/cuda-13.0-libs}
link=${PPL_CUDA_LINK:-$HOME/.cache/ppl/cuda-13.0-link}

step() { echo "== gpu-bundle: $* ($(date -u +%T))"; }
fail() {
  echo "gpu-bundle: $*" >&2
  exit 1
}
[ -x "$cpu_ppl" ] || fail "no CPU build at $cpu_ppl: run \`cargo build --release\` first (or set PPL_CPU_BIN)"
[ -f "$data_src" ] || fail "no text at $data_src: set DATA to WikiText-2's wiki.test.raw"
for tool in cc nm readelf strip xz python3; do
  command -v "$tool" >/dev/null 2>&1 || fail "needs $tool (binutils, a C compiler, xz, python3)"
done
# A copy of the CPU build: with PPL_BUNDLE_TARGET_DIR=target (CI) the CUDA build replaces
# target/release/ppl.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$cpu_ppl" "$work/ppl-cpu"
cpu_ppl=$work/ppl-cpu

# -- The compiler (nvcc from PyPI unless CUDA_HOME names a toolkit) and the link libraries.
# shellcheck source=/dev/null
source .ci/cuda-env
step "CUDA link libraries in $libs"
if [ ! -e "$libs/nvidia/cu13/lib/libcublasLt.so.13" ] || [ ! -e "$libs/nvidia/nccl/lib/libnccl.so.2" ]; then
  # --no-deps: the wheels' own dependencies are the runtime pieces the link does not need.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
    --no-deps --target "$libs" \
    "nvidia-cublas==13.0.2.14" "nvidia-curand==10.4.0.35" "nvidia-cuda-nvrtc==13.0.88" \
    "nvidia-nccl-cu13==2.27.7"
fi
# Unversioned link names (the wheels ship only the sonames), as a toolkit's lib/ has them.
mkdir -p "$link/lib/stubs"
for name in cublas cublasLt curand nvrtc nccl cudart; do
  real=$(find "$libs/nvidia" "$CUDA_HOME/lib" -name "lib$name.so.[0-9]*" 2>/dev/null | sort | head -n 1)
  [ -n "$real" ] || fail "lib$name.so.* is not in $libs or $CUDA_HOME/lib; delete $libs and rerun"
  ln -sfn "$real" "$link/lib/lib$name.so"
done

# -- The build. Its own target dir: other features than the normal build, and device code
# compiled with these nvcc flags only (candle-kernels does not rebuild when they change).
export CARGO_TARGET_DIR=$target CARGO_PROFILE_RELEASE_DEBUG=false CUDA_ROOT=$link
export NVCC_APPEND_FLAGS=$nvcc_flags
mkdir -p "$target"
flags_file=$target/ppl-bundle-nvcc-flags
if [ -f "$flags_file" ] && [ "$(cat "$flags_file")" != "$nvcc_flags" ]; then
  fail "$target holds device code built with NVCC_APPEND_FLAGS='$(cat "$flags_file")', not '$nvcc_flags': use another PPL_BUNDLE_TARGET_DIR or delete $target/release/build/candle-kernels-* and $flags_file"
fi
echo "$nvcc_flags" >"$flags_file"
step "cargo build --features cuda,nccl --lib (CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-from nvidia-smi}, NVCC_APPEND_FLAGS='$nvcc_flags')"
cargo build --release --locked --features cuda,nccl --lib

# The driver stub: every cu* driver function the compiled crates call, from their undefined
# symbols (cudarc's bindings, candle's and ppl's uses of them).
step "driver stub"
rlibs=("$target"/release/deps/lib{cudarc,candle_core,ppl}-*.rlib)
symbols=$( { nm -u "${rlibs[@]}" 2>/dev/null || true; } | awk '{print $NF}' |
  grep -E '^cu[A-Z][A-Za-z0-9_]*$' | sort -u)
count=$(echo "$symbols" | grep -c . || true)
[ "$count" -gt 0 ] || fail "found no driver symbols in ${rlibs[*]}"
{
  echo "/* Link-only stand-in for the NVIDIA driver library (generated by scripts/gpu-bundle.sh)."
  echo "   Every function returns CUDA_ERROR_STUB_LIBRARY (34). Never shipped. */"
  echo "$symbols" | while read -r sym; do echo "int $sym(void) { return 34; }"; done
} >"$link/lib/stubs/cuda-stub.c"
cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$link/lib/stubs/libcuda.so" "$link/lib/stubs/cuda-stub.c"
echo "stub: $count driver functions -> $link/lib/stubs/libcuda.so"

step "cargo build --features cuda,nccl --bin ppl (the link)"
cargo build --release --locked --features cuda,nccl --bin ppl

step "binary"
cp "$target/release/ppl" "$work/ppl"
strip "$work/ppl"
needed=$(readelf -d "$work/ppl" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo "$needed" | tr '\n' ' ')"
# The linker keeps only the libraries whose symbols are used (cuBLASLt and NVRTC are not,
# here); the driver, cuBLAS and NCCL must be there, by soname.
for soname in libcuda.so.1 libcublas.so.13 libnccl.so.2; do
  echo "$needed" | grep -qx "$soname" || fail "the binary does not record $soname (NEEDED: $needed)"
done
if echo "$needed" | grep -qE '(/|\.so$)'; then
  fail "the binary records an unversioned name or a path: $needed"
fi
if readelf -d "$work/ppl" | grep -qE '\((RPATH|RUNPATH)\)'; then
  fail "the binary carries an RPATH/RUNPATH (the GPU machine's libraries must be found by LD_LIBRARY_PATH)"
fi
# xz: candle's kernels make the binary large (85 MB with -O0 device code) and very
# compressible (6 MB); run.sh unpacks it with python's lzma.
xz -T2 -2 -c "$work/ppl" >"$outdir/ppl.xz"
echo "ppl: $(wc -c <"$work/ppl") bytes stripped, ppl.xz $(wc -c <"$outdir/ppl.xz") bytes"

# -- Models, text, the runs and their CPU results (the normal build).
step "models (random weights, SmolLM2's tokenizer)"
smol=$("$cpu_ppl" fetch-model)
mkdir -p "$outdir/models" "$outdir/cpu"
for type in f16 q8_0; do
  "$cpu_ppl" synth --shape custom --hidden 128 --layers 8 --heads 2 --kv-heads 1 --ffn 512 \
    --type "$type" --tokenizer-from "$smol" --seed 26 -o "$outdir/models/tiny-$type.gguf" --quiet
done
# Whole lines, at most data_bytes (LC_ALL=C: awk counts bytes).
LC_ALL=C awk -v max="$data_bytes" '{ n += length($0) + 1; if (n > max) exit; print }' \
  "$data_src" >"$outdir/data.txt"

# name, model, precision, batch size. "-again" repeats a run (run-to-run bits); CPU results
# exist per model and precision (the CPU's bits do not depend on the batch size).
cat >"$outdir/runs.tsv" <<'EOF'
f16-f32-b1	tiny-f16	f32	1
f16-f32-b1-again	tiny-f16	f32	1
f16-f32-b16	tiny-f16	f32	16
f16-native-b1	tiny-f16	native	1
f16-native-b1-again	tiny-f16	native	1
f16-bf16-b1	tiny-f16	bf16	1
q8-f32-b1	tiny-q8_0	f32	1
q8-native-b1	tiny-q8_0	native	1
q8-native-b1-again	tiny-q8_0	native	1
q8-native-b16	tiny-q8_0	native	16
q8-bf16-b1	tiny-q8_0	bf16	1
EOF
step "CPU results (normal build, $(nproc) cores)"
cut -f2,3 "$outdir/runs.tsv" | sort -u | while read -r model precision; do
  start=$(date +%s)
  "$cpu_ppl" eval --model "$outdir/models/$model.gguf" --data "$outdir/data.txt" --ctx 512 \
    --precision "$precision" --batch-size 1 --progress none --quiet \
    --output "$outdir/cpu/$model-$precision.json"
  echo "cpu/$model-$precision.json ($(($(date +%s) - start)) s)"
done

cp scripts/gpu-bundle-run.sh "$outdir/run.sh"
chmod +x "$outdir/run.sh"
cat >"$outdir/README.txt" <<EOF
ppl CUDA bundle (scripts/gpu-bundle.sh, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F))

On a machine with an NVIDIA GPU, its driver, and a python3 with the CUDA 13 PyPI packages
(nvidia-cublas, nvidia-curand, nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-nccl-cu13;
PyTorch's CUDA 13 install has them):

    OUT=/some/dir bash run.sh        # PYTHON=... names another python3

run.sh finds those libraries, prints nvidia-smi, runs runs.tsv on GPU 0 (expected: about a minute;
each run is cut at 120 s, the whole at 8 minutes), and writes under \$OUT (default ./results)
each run's results.json, log and sampled GPU memory, and summary.txt: PPL against the CPU
figures in cpu/ (goals: f32 within 1e-5 relative, native within 1e-3), run-to-run bits,
batch size 1 vs 16, tokens/s, peak GPU memory. Without a GPU or driver it stops at once with
the reason (exit 3).

ppl.xz        --features cuda,nccl, compute capability 90 (H100/H200), device code nvcc
              flags '${nvcc_flags:-default (optimised)}', stripped; links libcuda.so.1 and
              the CUDA 13 libraries by soname (NEEDED: $(echo "$needed" | tr '\n' ' '))
models/       random weights (seed 26), SmolLM2-135M's tokenizer (49152 tokens): Llama,
              hidden 128, 8 layers, 2 heads / 1 KV, FFN 512, tied; F16 and Q8_0
data.txt      the first $(wc -c <"$outdir/data.txt") bytes of WikiText-2's wiki.test.raw (whole lines)
runs.tsv      name, model, precision, batch size (ctx 512)
cpu/          results.json of each model and precision on the CPU (normal build)

A random-weight model's PPL is near its vocabulary size and means nothing as a score. It is
also a weak GPU-vs-CPU test (nearly uniform predictions: on the CPU bf16 is within 1.5e-5
of f32), so the summary also gives the largest per-window change of the mean NLL (CPU, bf16
vs f32: 7e-4 nats), and the run-to-run and batch-size checks compare exact bits.
EOF

size=$(du -sb "$outdir" | cut -f1)
echo
ls -l "$outdir" "$outdir/models" "$outdir/cpu"
echo "bundle: $outdir, $size bytes ($((size / 1024 / 1024)) MiB; limit 60 MiB)"
if find "$outdir" -name 'libcuda*' | grep -q .; then
  fail "a libcuda file is in $outdir: the stub must never be shipped"
fi
[ "$size" -le "$max_bytes" ] || fail "the bundle is $size bytes, over 60 MiB ($max_bytes)"
