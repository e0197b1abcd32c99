#!/usr/bin/env bash
# Model-parallel layouts side by side on one machine: tokens/s, weights and peak RSS per rank,
# bytes communicated per token, and the PPL (which must not move for pp and dp_shard).
#
#   scripts/bench-mesh.sh [CHUNKS] [PRECISION]        (defaults: 8 chunks, native)
#   COMM_DTYPES=1 scripts/bench-mesh.sh               also every --comm-dtype for pp=2 and tp=3
#
# Multi-rank layouts run under mpirun (one process per rank, so each rank's peak RSS is its
# own); the machine's cores are shared out (threads per rank = cores / ranks, at least 1).
# Needs a build with `--features mpi` and OpenMPI.
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNKS=${1:-8}
PRECISION=${2:-native}
PPL=./target/release/ppl
MODEL=${PPL_MODEL:-$($PPL fetch-model)}
DATA=${PPL_DATA:-../shared/data/wikitext-2-raw/wiki.test.raw}
CORES=$(nproc)
OUT=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run() { # name ranks flags...
  local name=$1 np=$2
  shift 2
  local threads=$(( CORES / np > 0 ? CORES / np : 1 ))
  local common=(eval --model "$MODEL" --data "$DATA" --chunks "$CHUNKS" --precision "$PRECISION"
    --threads "$threads" --progress none --quiet --output "$OUT/$name.json")
  if [ "$np" = 1 ]; then
    "$PPL" "${common[@]}" "$@"
  else
    mpirun --oversubscribe --bind-to none -np "$np" "$PPL" "${common[@]}" "$@"
  fi
}

run single 1
run dp2 2
run pp2 2 --pp 2
run fsdp2 2 --dp-shard 2
run tp3 3 --tp 3
run dp2xpp2 4 --dp-replicate 2 --pp 2
if [ "${COMM_DTYPES:-0}" = 1 ]; then
  for d in bf16 f16 int8; do
    run "pp2-$d" 2 --pp 2 --comm-dtype "$d"
    run "tp3-$d" 3 --tp 3 --comm-dtype "$d"
  done
fi

python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
runs = {n[:-5]: json.load(open(os.path.join(out, n))) for n in sorted(os.listdir(out))}
base = runs["single"]
mib = lambda b: b / 2**20
print(f"{'layout':<14}{'ranks':>6}{'tok/s':>9}{'× 1 rank':>10}{'weights/rank MiB':>18}{'peak RSS/rank MiB':>19}{'sent B/token':>14}  PPL")
order = ["single", "dp2", "pp2", "fsdp2", "tp3", "dp2xpp2"] + sorted(k for k in runs if "-" in k)
for name in order:
    r = runs.get(name)
    if r is None:
        continue
    tps = r["timings"]["tokens_per_s"]
    tokens = sum(w["input_tokens"] for w in r["windows"])
    mesh = r.get("mesh")
    if mesh:
        w = [m["weights_bytes"] for m in mesh["ranks"]]
        rss = [m["peak_rss_bytes"] or 0 for m in mesh["ranks"]]
        sent = sum(m["bytes_sent"] for m in mesh["ranks"]) / tokens
        weights = f"{mib(min(w)):.1f}–{mib(max(w)):.1f}"
        peak = f"{mib(min(rss)):.0f}–{mib(max(rss)):.0f}"
    else:
        est = (r.get("memory") or {}).get("estimate") or {}
        weights, sent = f"{mib(est.get('weights_bytes', 0)):.1f} (all)", 0.0
        peak = f"{mib(r['system']['peak_rss_bytes'] or 0):.0f}"
    delta = (r["ppl"] - base["ppl"]) / base["ppl"]
    print(f"{name:<14}{r['world']['size']:>6}{tps:>9.1f}{tps / base['timings']['tokens_per_s']:>10.2f}"
          f"{weights:>18}{peak:>19}{sent:>14.0f}  {r['ppl']:.6f} ({delta:+.2e})")
EOF
rm -rf "$OUT"
