#!/usr/bin/env bash
# The benchmark matrix of issue 19: models × storage types × thread counts, each cell run by
# `ppl bench` (every run its own process, whole process timed including the load, rounds
# alternating ppl and llama.cpp's llama-perplexity on the same file, median of the per-round
# speed ratios), written as one Markdown table: tokens/s of both, the ratio, peak RSS of
# both, and the fraction of the machine's f32 FMA peak each reaches.
#
# The models are made once into a cache directory: the SmolLM2 test model's conversions with
# `ppl export` / `ppl quantize`, the Gemma 3 270M model with `ppl fetch-model gemma3`, the
# Llama shapes with `ppl synth` (random weights: speed and memory only, their PPL means
# nothing).
#
#   scripts/bench-matrix.sh --list                          # the cells, and which are cached
#   scripts/bench-matrix.sh --llama-perplexity BIN          # everything (hours on 2 cores)
#   scripts/bench-matrix.sh --filter 'smollm2/(q4_1|f32)' --threads 1,2 --repeat 3 \
#       --llama-perplexity BIN --out smollm2.md
#
# Requirements: a release build (or PPL=path/to/ppl), python3 (fetch-model), jq, GNU time
# (/usr/bin/time, used by `ppl bench` for llama.cpp's peak RSS), cc for the FMA peak.
set -euo pipefail

usage() {
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

Options:
  --filter REGEX            cells whose id (model/type@tN) matches (grep -E) [all]
  --threads LIST            comma-separated thread counts [the number of cores]
  --repeat N                rounds per cell [3]
  --ctx N                   window length [512]
  --llama-perplexity BIN    run llama.cpp side by side (else ppl alone)
  --data FILE               text [../shared/data/wikitext-2-raw/wiki.test.raw]
  --cache-dir DIR           where the models are made [$PPL_CACHE_DIR or ~/.cache/ppl]/bench-matrix
  --out FILE                the Markdown table [bench-matrix.md]; per-cell JSON in FILE.d/
  --peak-gflops X           the machine's arithmetic peak in GFLOP/s, all cores (a cell's is
                            X × threads / cores) instead of the FMA micro-benchmark's
  --list                    print the cells (and whether their model is made) and exit
EOF
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PPL=${PPL:-$ROOT/target/release/ppl}
FILTER=.
THREADS=$(nproc)
REPEAT=3
CTX=512
LLAMA=
DATA=$ROOT/../shared/data/wikitext-2-raw/wiki.test.raw
CACHE=${PPL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ppl}/bench-matrix
OUT=bench-matrix.md
PEAK_GFLOPS=
LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        --filter) FILTER=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --repeat) REPEAT=$2; shift 2 ;;
        --ctx) CTX=$2; shift 2 ;;
        --llama-perplexity) LLAMA=$2; shift 2 ;;
        --data) DATA=$2; shift 2 ;;
        --cache-dir) CACHE=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --peak-gflops) PEAK_GFLOPS=$2; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-matrix: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "bench-matrix: $*" >&2; exit 1; }
[ -x "$PPL" ] || die "no ppl binary at $PPL: run 'cargo build --release' or set PPL=path/to/ppl"
[ -f "$DATA" ] || die "data file $DATA not found: pass it with --data"
[ -z "$LLAMA" ] || [ -x "$LLAMA" ] || die "--llama-perplexity $LLAMA is not an executable"
command -v jq >/dev/null || die "jq is needed to read ppl bench's JSON (apt-get install jq)"

# The cells: id (model/type), chunks. Threads multiply them.
CELLS=(
    "smollm2/q4_1 8"
    "smollm2/f32 8"
    "smollm2/bf16 8"
    "smollm2/q8_0 8"
    "smollm2/q4_0 8"
    "smollm2/q4_k_m 8"
    "gemma3-270m/q4_k_m 4"
    "llama3.2-1b/bf16 2"
    "llama3.2-1b/q8_0 2"
    "llama3.2-1b/q4_k_m 2"
    "llama3.2-1b/q6_k 2"
    "llama3.2-1b/q3_k 2"
    "llama3.2-1b/q2_k 2"
    "smollm2/iq4_nl 8"
    "llama3.2-1b/iq4_nl 2"
    "smollm2/iq4_xs 8"
    "llama3.2-1b/iq4_xs 2"
    "llama3.1-8b/q4_k_m 2"
)

# Attention dimensions the FLOP count needs beyond `ppl inspect --json`: head size, and
# whether the output layer is the embedding table (tied: the table's multiply counts once).
declare -A HEAD_DIM=([smollm2]=64 [gemma3-270m]=256 [llama3.2-1b]=64 [llama3.1-8b]=128)
declare -A TIED=([smollm2]=1 [gemma3-270m]=1 [llama3.2-1b]=1 [llama3.1-8b]=0)

# The model file of a cell (may not exist yet).
model_path() {
    local model=${1%/*} type=${1#*/}
    case "$model/$type" in
        smollm2/q4_1) "$PPL" fetch-model ;;
        gemma3-270m/q4_k_m) "$PPL" fetch-model gemma3 ;;
        *) echo "$CACHE/$model-$type.gguf" ;;
    esac
}

# Makes the model of a cell if it is not cached (every writer renames into place at the end).
make_model() {
    local model=${1%/*} type=${1#*/} path
    path=$(model_path "$1")
    [ -f "$path" ] && { echo "$path"; return; }
    mkdir -p "$CACHE"
    local smollm2
    smollm2=$("$PPL" fetch-model)
    echo "bench-matrix: making $path" >&2
    case "$model/$type" in
        */iq4_nl|*/iq4_xs)
            # ppl reads IQ4_NL and IQ4_XS but does not write them: llama.cpp's quantizer
            # does, from an f16 copy (SmolLM2's export, or the shape's random weights in f16).
            # Its IQ4_XS mix keeps IQ4_NL where rows are not a multiple of 256 (SmolLM2's 576).
            local quantize=${LLAMA%/*}/llama-quantize f16
            [ -n "$LLAMA" ] ||
                die "$1 is written by llama.cpp's llama-quantize, looked for beside --llama-perplexity: pass --llama-perplexity BIN"
            [ -x "$quantize" ] ||
                die "$1 is written by llama.cpp's llama-quantize, looked for beside --llama-perplexity ($quantize): build it with 'cmake --build build --target llama-quantize'"
            f16=$(make_model "$model/f16")
            "$quantize" "$f16" "$path" "${type^^}" 2 >&2 ;;
        smollm2/f32|smollm2/bf16|smollm2/f16) "$PPL" export "$smollm2" --dtype "$type" -o "$path" >&2 ;;
        smollm2/*) "$PPL" quantize "$smollm2" "$path" --type "$type" >&2 ;;
        llama3.2-1b/*|llama3.1-8b/*)
            "$PPL" synth --shape "$model" --type "$type" --tokenizer-from "$smollm2" -o "$path" >&2 ;;
        *) die "no recipe for $model/$type" ;;
    esac
    echo "$path"
}

# Selected cells, with their thread counts: "id@tN chunks".
SELECTED=()
for cell in "${CELLS[@]}"; do
    read -r id chunks <<<"$cell"
    for t in ${THREADS//,/ }; do
        if grep -Eq -- "$FILTER" <<<"$id@t$t"; then SELECTED+=("$id@t$t $chunks"); fi
    done
done
[ ${#SELECTED[@]} -gt 0 ] || die "no cell matches --filter '$FILTER' (see --list)"

if [ "$LIST" = 1 ]; then
    for cell in "${SELECTED[@]}"; do
        read -r id chunks <<<"$cell"
        path=$(model_path "${id%@*}")
        state=missing; [ -f "$path" ] && state=cached
        printf '%-26s %2s chunks  %-7s %s\n' "$id" "$chunks" "$state" "$path"
    done
    exit 0
fi

CORES=$(nproc)
# The arithmetic peak: f32 FMA throughput of one core (12 independent vector accumulators,
# the widest vectors the compiler targets) times the cores, or given.
if [ -z "$PEAK_GFLOPS" ]; then
    command -v cc >/dev/null || die "no C compiler for the FMA micro-benchmark: pass --peak-gflops"
    FMA_DIR=$(mktemp -d)
    cat >"$FMA_DIR/fma.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __AVX512F__
#define W 16
#else
#define W 8
#endif
typedef float vf __attribute__((vector_size(W * 4)));
#define N 12
int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 100000000;
    vf acc[N], a, b;
    for (int j = 0; j < W; j++) { a[j] = 0.999999f; b[j] = 1e-7f; }
    for (int i = 0; i < N; i++) for (int j = 0; j < W; j++) acc[i][j] = (float)i;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < N; i++) acc[i] = acc[i] * a + b;
        __asm__ volatile("" : "+x"(a));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float s = 0;
    for (int i = 0; i < N; i++) for (int j = 0; j < W; j++) s += acc[i][j];
    double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    printf("%.3f %d %g\n", 2.0 * N * W * iters / secs / 1e9, W, s);
    return 0;
}
EOF
    cc -O3 -march=native -ffp-contract=fast -funroll-loops -o "$FMA_DIR/fma" "$FMA_DIR/fma.c"
    # Best of three single-core runs (other processes on a shared machine only slow a run
    # down), times the cores: the peak of the hardware, not of the moment.
    for i in 1 2 3; do "$FMA_DIR/fma" 50000000 >"$FMA_DIR/out.$i"; done
    CORE_GFLOPS=$(cat "$FMA_DIR"/out.* | awk '$1 > m {m = $1} END {printf "%.1f", m}')
    PEAK_GFLOPS=$(awk -v g="$CORE_GFLOPS" -v c="$CORES" 'BEGIN {printf "%.1f", g * c}')
    WIDTH=$(awk '{print $2 * 32}' "$FMA_DIR/out.1")
    PEAK_HOW="f32 FMA micro-benchmark (${WIDTH}-bit vectors, 12 chains, best of 3 single-core runs: $CORE_GFLOPS GFLOP/s) × $CORES cores = $PEAK_GFLOPS GFLOP/s"
    rm -rf "$FMA_DIR"
else
    PEAK_HOW="given: $PEAK_GFLOPS GFLOP/s on $CORES cores"
fi

JSON_DIR=${OUT%.md}.d
mkdir -p "$JSON_DIR"
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "Measured $(date -u +'%Y-%m-%d %H:%M UTC') on $CPU ($CORES cores), ppl $COMMIT, ctx $CTX,"
    echo "$REPEAT rounds per cell, whole process timed (load included), runs alternating;"
    echo "llama.cpp: ${LLAMA:-not run}. Peak: $PEAK_HOW (a cell with N threads: × N / $CORES)."
    echo "FLOPs per token: 2 × matrix parameters (an untied embedding table is a lookup) + 4 ×"
    echo "layers × heads × head size × (ctx + 1) / 2 for causal attention."
    echo
    echo "| cell (chunks) | ppl tok/s | llama.cpp tok/s | ppl / llama.cpp | peak RSS ppl / llama.cpp (MiB) | GFLOP/token | % of peak ppl / llama.cpp |"
    echo "|---|---|---|---|---|---|---|"
} >"$OUT"

JSONS=()
for cell in "${SELECTED[@]}"; do
    read -r id chunks <<<"$cell"
    base=${id%@*} threads=${id#*@t} model=${id%%/*}
    path=$(make_model "$base")
    json="$JSON_DIR/${id//\//-}.json"
    JSONS+=("$json")
    echo "bench-matrix: $id ($chunks chunks of $CTX, $REPEAT rounds)" >&2
    args=(bench --model "$path" --data "$DATA" --ctx "$CTX" --chunks "$chunks" --threads "$threads"
        --precision native --repeat "$REPEAT" --output "$json")
    [ -n "$LLAMA" ] && args+=(--llama-perplexity "$LLAMA")
    "$PPL" "${args[@]}" >&2
    info=$("$PPL" inspect "$path" --json)
    jq -r --argjson info "$info" --arg cell "$id ($chunks)" --argjson ctx "$CTX" \
        --argjson hd "${HEAD_DIM[$model]}" --argjson tied "${TIED[$model]}" \
        --argjson peak "$PEAK_GFLOPS" --argjson threads "$threads" --argjson cores "$CORES" '
        def median: sort | if length == 0 then null
            elif length % 2 == 1 then .[length / 2 | floor]
            else (.[length / 2 - 1] + .[length / 2]) / 2 end;
        def runs($tool): [.measurements[] | select(.tool == $tool)];
        def fmt($d): if . == null then "-" else (. * pow(10; $d) | round / pow(10; $d) | tostring) end;
        def mib: if . == null then "-" else (. / 1048576 | round | tostring) end;
        (runs("ppl") | map(.tokens_per_s_wall) | median) as $ours
        | (runs("llama.cpp") | map(.tokens_per_s_wall) | median) as $theirs
        | (runs("ppl") | map(.peak_rss_bytes) | max) as $our_rss
        | (runs("llama.cpp") | map(.peak_rss_bytes) | max) as $their_rss
        | (.median_speedup_vs_llama_cpp | map(.[1]) | first) as $ratio
        | ($info.parameters - (if $tied == 1 then 0 else $info.vocab_size * $info.hidden_size end)) as $matrix
        | (2 * $matrix + 4 * $info.layers * $info.heads * $hd * ($ctx + 1) / 2) as $flops
        | ($peak * 1e9 * $threads / $cores) as $cell_peak
        | def pct: if . == null then "-" else (. * $flops / $cell_peak * 100 | fmt(1)) + "%" end;
        "| \($cell) | \($ours | fmt(1)) | \($theirs | fmt(1)) | \(if $ratio == null then "-" else ($ratio | fmt(2)) + "×" end) | \($our_rss | mib) / \($their_rss | mib) | \($flops / 1e9 | fmt(3)) | \($ours | pct) / \($theirs | pct) |"
    ' "$json" >>"$OUT"
    tail -1 "$OUT" >&2
done
# What each tool says it ran, over this run's cells (one line per distinct value): ppl's kernel
# level and how it was chosen, llama.cpp's `system_info` (the instruction sets and kernels it
# built and uses: AMX_INT8, REPACK, …), and a LLAMA_ARG_REPACK given to llama.cpp.
{
    echo
    jq -rs '[.[].measurements[] | select(.tool == "ppl") | .kernels // empty] | unique | .[]
        | "ppl kernels: \(.)"' "${JSONS[@]}"
    jq -rs '[.[].measurements[] | select(.tool == "llama.cpp") | .kernels // empty] | unique | .[]
        | "llama.cpp system_info: \(.)"' "${JSONS[@]}"
    [ -z "${LLAMA_ARG_REPACK:-}" ] || echo "llama.cpp ran with LLAMA_ARG_REPACK=$LLAMA_ARG_REPACK"
} >>"$OUT"
cat "$OUT"
