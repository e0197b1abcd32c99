#!/usr/bin/env bash
# Layouts over TCP between network-namespace hosts (scripts/cluster.sh) against the same layouts
# in one host over shared memory: tokens/s, ppl's communication share, ppl's own byte counters
# and the bytes that crossed the hosts' interfaces (ip -s link), per token. Prints a Markdown
# table. Needs root, iproute2, Open MPI and a `--features mpi` build.
#
#   scripts/cluster-bench.sh [--model M.gguf] [--data TEXT] [--chunks N] [--ctx N]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/cluster.sh"
export PPL_BIN=${PPL_BIN:-$here/../target/release/ppl}
model=""; data="$here/../../shared/data/wikitext-2-raw/wiki.test.raw"; chunks=8; ctx=512
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2;;
    --data) data=$2; shift 2;;
    --chunks) chunks=$2; shift 2;;
    --ctx) ctx=$2; shift 2;;
    *) echo "cluster-bench.sh: unknown option $1" >&2; exit 2;;
  esac
done
[ -n "$model" ] || model=$("$PPL_BIN" fetch-model)
export PPL_CLUSTER_PREFIX=pplb
work=$(mktemp -d)
trap 'bash "$cluster" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# Bytes received by every host's interface (what crossed the bridge).
wire_bytes() {
  local n=$1 i total=0 b
  for i in $(seq 1 "$n"); do
    b=$(ip -n "pplb-h$i" -s -j link show eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
    total=$((total + b))
  done
  echo "$total"
}

# One line of the table from a results.json: tokens/s, comm share, ppl bytes sent per token.
summarize() {
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1])); wire = int(sys.argv[2]); where = sys.argv[3]
ranks = r["mesh"]["ranks"] if r.get("mesh") else r["ranks"]
comm = sum(x.get("comm_s", 0.0) for x in ranks)
busy = sum(x.get("comm_s", 0.0) + x.get("compute_s", 0.0) for x in ranks)
sent = sum(x.get("bytes_sent", 0) for x in ranks)
tokens = len(r["windows"]) * r["config"]["ctx"]  # tokens through the model
print(f"| {where} | {r['timings']['tokens_per_s']:.1f} | {100 * comm / busy:.2f}% | "
      f"{sent / tokens:,.0f} | {(wire / tokens if wire else 0):,.0f} | {r['ppl']:.6f} |")
EOF
}

echo "| layout | where | tokens/s | comm share | ppl bytes sent / token | wire bytes / token | PPL |"
echo "|---|---|---|---|---|---|---|"
for layout in "dp 2:" "pp 2:--pp 2" "dp_shard 2:--dp-shard 2" "tp 3:--tp 3"; do
  name=${layout%%:*}; flags=${layout#*:}; n=${name##* }
  args=(eval -m "$model" -f "$data" --ctx "$ctx" --chunks "$chunks" --progress none --quiet)
  # shellcheck disable=SC2206
  extra=($flags)
  bash "$cluster" up "$n" >/dev/null
  before=$(wire_bytes "$n")
  bash "$cluster" launch -- "${args[@]}" "${extra[@]}" -o "$work/tcp.json" --run-dir "$work/tcp-run" 2>/dev/null
  after=$(wire_bytes "$n")
  printf '| %s ' "$name"; summarize "$work/tcp.json" $((after - before)) "$n hosts, TCP"
  # The same ranks in one host: Open MPI's shared-memory transport.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    bash "$cluster" exec 1 -- mpirun -np "$n" --oversubscribe --bind-to none --mca btl self,vader \
    "$PPL_BIN" "${args[@]}" "${extra[@]}" -o "$work/shm.json" --run-dir "$work/shm-run" 2>/dev/null
  printf '| %s ' "$name"; summarize "$work/shm.json" 0 "1 host, shared memory"
  bash "$cluster" down >/dev/null
  rm -rf "$work"/*-run
done
