#!/usr/bin/env bash
# Thread scaling, measured side by side: `ppl eval` of each model with `--threads LOW` and
# `--threads HIGH` alternating (each run its own process), several rounds, and per model the
# per-round speed-ups HIGH over LOW — of the whole process (load included) and of the
# evaluation alone (results.json `timings.eval_s`) — and their medians. Every run's PPL must
# be the same bits (`ppl` is exact whatever the thread count); a difference fails the script.
#
#   scripts/bench-threads.sh ~/.cache/ppl/bench-matrix/llama3.2-1b-{bf16,q8_0,q4_k_m,q6_k}.gguf
#   scripts/bench-threads.sh --threads 1,2 --rounds 5 --chunks 2 MODEL.gguf
#   PPL_ISA=avx512 scripts/bench-threads.sh MODEL.gguf      # at a capped kernel level
#
# Requirements: a release build (or PPL=path/to/ppl), jq, and the data file.
set -euo pipefail

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'EOF'

Options:
  --threads LOW,HIGH   the two thread counts [1,2]
  --rounds N           alternations [3]
  --chunks N           windows per run [2]
  --ctx N              window length [512]
  --data FILE          text [../shared/data/wikitext-2-raw/wiki.test.raw]
EOF
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PPL=${PPL:-$ROOT/target/release/ppl}
THREADS=1,2
ROUNDS=3
CHUNKS=2
CTX=512
DATA=$ROOT/../shared/data/wikitext-2-raw/wiki.test.raw
MODELS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) THREADS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --chunks) CHUNKS=$2; shift 2 ;;
        --ctx) CTX=$2; shift 2 ;;
        --data) DATA=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "bench-threads: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) MODELS+=("$1"); shift ;;
    esac
done

die() { echo "bench-threads: $*" >&2; exit 1; }
[ ${#MODELS[@]} -gt 0 ] || die "no model given (see --help)"
[ -x "$PPL" ] || die "no ppl binary at $PPL: run 'cargo build --release' or set PPL=path/to/ppl"
[ -f "$DATA" ] || die "data file $DATA not found: pass it with --data"
command -v jq >/dev/null || die "jq is needed to read results.json (apt-get install jq)"
IFS=, read -r LOW HIGH <<<"$THREADS"
[[ "$LOW" =~ ^[1-9][0-9]*$ && "$HIGH" =~ ^[1-9][0-9]*$ ]] ||
    die "--threads takes two counts, LOW,HIGH (got '$THREADS')"
for model in "${MODELS[@]}"; do
    [ -f "$model" ] || die "model file $model not found"
done

SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# One run: prints "wall_s eval_s ppl_bits kernels".
run() {
    local model=$1 threads=$2 out=$SCRATCH/r.json
    local t0 t1
    # No earlier run's results may stand in for a failed one.
    rm -f "$out"
    t0=$(date +%s.%N)
    "$PPL" eval --model "$model" --data "$DATA" --ctx "$CTX" --chunks "$CHUNKS" \
        --threads "$threads" --progress none --quiet --output "$out" \
        --run-dir "$SCRATCH/run" >/dev/null || return 1
    t1=$(date +%s.%N)
    rm -rf "$SCRATCH/run"
    jq -r --arg wall "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')" \
        '"\($wall) \(.timings.eval_s * 1000 | round / 1000) \(.ppl) \(.system.kernels.isa // "-")"' "$out"
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "threads $HIGH over $LOW, $ROUNDS rounds alternating, ctx $CTX, $CHUNKS chunks, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
for model in "${MODELS[@]}"; do
    # Read once before the rounds (as `ppl bench` does), so that the first run, at LOW
    # threads, does not alone pay for a model file not yet in the page cache.
    cat "$model" >/dev/null
    walls=() evals=() ppl_seen=
    for round in $(seq 1 "$ROUNDS"); do
        # Assignments, so that a failed run stops the script (a here-string would hide it).
        low=$(run "$model" "$LOW") || die "$model: ppl eval --threads $LOW failed"
        high=$(run "$model" "$HIGH") || die "$model: ppl eval --threads $HIGH failed"
        read -r wl el pl kl <<<"$low"
        read -r wh eh ph kh <<<"$high"
        for p in "$pl" "$ph"; do
            [ -z "$ppl_seen" ] && ppl_seen=$p
            [ "$p" = "$ppl_seen" ] || die "$model: PPL $p differs from $ppl_seen (threads must not change the result)"
        done
        walls+=("$(awk -v a="$wl" -v b="$wh" 'BEGIN {printf "%.2f", a / b}')")
        evals+=("$(awk -v a="$el" -v b="$eh" 'BEGIN {printf "%.2f", a / b}')")
        echo "  $(basename "$model") round $round: wall $wl s / $wh s, eval $el s / $eh s (kernels $kl / $kh)"
    done
    wall_median=$(printf '%s\n' "${walls[@]}" | median)
    eval_median=$(printf '%s\n' "${evals[@]}" | median)
    echo "$(basename "$model"): whole process ${wall_median}× (${walls[*]}), eval ${eval_median}× (${evals[*]}), PPL $ppl_seen at both"
done
