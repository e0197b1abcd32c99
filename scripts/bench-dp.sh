#!/usr/bin/env bash
# Data-parallel benchmark: 1 rank x 2 threads vs 2 ranks x 1 thread (local backend and MPI),
# run alternately, on the reference workload. Prints tokens/s (wall of the eval phase),
# the communication share of wall time and peak RSS per rank.
# Usage: scripts/bench-dp.sh [chunks] [rounds]   (needs a `--features mpi` build for the MPI rows)
set -euo pipefail
cd "$(dirname "$0")/.."
chunks=${1:-8}
rounds=${2:-2}
ppl=./target/release/ppl
model=$($ppl fetch-model)
data=../shared/data/wikitext-2-raw/wiki.test.raw
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(eval --model "$model" --data "$data" --ctx 512 --chunks "$chunks" --precision f32 --progress none --quiet)
for round in $(seq 1 "$rounds"); do
  $ppl "${common[@]}" --ranks 1 --threads 2 --output "$out/local-1x2-$round.json"
  $ppl "${common[@]}" --ranks 2 --threads 2 --output "$out/local-2x1-$round.json"
  if command -v mpirun >/dev/null; then
    mpirun --oversubscribe --bind-to none -np 2 $ppl "${common[@]}" --threads 1 --output "$out/mpi-2x1-$round.json" || true
  fi
done
python3 - "$out" <<'PY'
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    name = os.path.basename(f).rsplit("-", 1)[0]
    r = json.load(open(f))
    tokens = sum(w["input_tokens"] for w in r["windows"])
    wall = r["timings"]["eval_s"]
    comm = max(x["comm_s"] for x in r["ranks"])
    rss = [round((x["peak_rss_bytes"] or 0) / 2**20) for x in r["ranks"]]
    rows.setdefault(name, []).append((tokens / wall, comm / wall, rss, r["ppl"]))
base = None
print(f"{'layout':<12} {'tok/s (median)':>15} {'ratio':>6} {'comm share':>11} {'peak RSS MiB per rank':>24} {'PPL':>10}")
for name in ["local-1x2", "local-2x1", "mpi-2x1"]:
    if name not in rows: continue
    v = rows[name]
    tps = sorted(x[0] for x in v)[len(v) // 2]
    base = base or tps
    print(f"{name:<12} {tps:>15.1f} {tps / base:>6.2f} {max(x[1] for x in v):>10.4%} {str(v[-1][2]):>24} {v[-1][3]:>10.4f}")
PY
