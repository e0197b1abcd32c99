#!/usr/bin/env bash
# A cluster of N hosts on this machine, for trying and testing multi-node ppl over a real
# network stack: each host is a network namespace (its own interface, address and routing) on a
# bridge, runs its commands under its own hostname (a UTS namespace) and in its own memory cgroup
# (v1 memory.limit_in_bytes, or v2 memory.max). OpenMPI is launched across the hosts over TCP only,
# through an rsh agent that enters a host instead of ssh-ing to it. Nothing leaves the machine:
# the addresses are those of the cluster's own namespaces (10.250.0.0/24), and the bridge lives in
# a namespace of its own, not on the machine's network.
#
#   cluster.sh up N [--mem SIZE]     make hosts ppl-h1 … ppl-hN (SIZE: per-host memory limit, e.g. 600M)
#   cluster.sh down                  remove them (and kill what runs on them)
#   cluster.sh exec HOST -- CMD …    run CMD on HOST (1, h1 or ppl-h1; or its address)
#   cluster.sh mpirun [-np N] [--per-host K] [MPIRUN_ARGS …] -- CMD …
#                                    mpirun on host 1 across all hosts (K ranks each, default 1),
#                                    TCP only, with the settings that end a job whose host is lost
#   cluster.sh launch [--hosts N] [--per-host K] -- PPL_ARGS …
#                                    `ppl launch` on host 1 across the first N hosts (default all),
#                                    K ranks each (PPL_BIN: the ppl to run)
#   cluster.sh cut HOST | heal [HOST] cut HOST off the switch / bring it (or every host) back
#   cluster.sh slow HOST DELAY RATE  emulate a slow link with netem, e.g. `slow 2 20ms 100mbit`
#   cluster.sh kill HOST             SIGKILL every process running on HOST
#   cluster.sh mem HOST SIZE         change HOST's memory limit
#   cluster.sh peak HOST             HOST's peak memory use in bytes (cgroup max_usage / peak)
#   cluster.sh hosts                 the host list as `address:slots,…` for mpirun --host
#   cluster.sh agent ADDR CMD …      (OpenMPI's rsh agent: runs CMD on the host at ADDR)
#
# Needs root, iproute2 (ip), util-linux (unshare, nsenter) and, for `slow`, tc (iproute2).
set -euo pipefail

PREFIX=${PPL_CLUSTER_PREFIX:-ppl}
SUBNET=10.250.0
SWITCH="$PREFIX-sw"
BRIDGE="${PREFIX}br0"
STATE=${PPL_CLUSTER_STATE:-/run/$PREFIX-cluster}
SELF=$(readlink -f "${BASH_SOURCE[0]}")

die() { echo "cluster.sh: $*" >&2; exit 1; }

# The cgroup v1 memory hierarchy, or empty on a v2-only machine.
cg1=/sys/fs/cgroup/memory
cg_dir() {
  if [ -d "$cg1" ]; then echo "$cg1/$PREFIX-h$1"; else echo "/sys/fs/cgroup/$PREFIX-h$1"; fi
}

count() { cat "$STATE/hosts" 2>/dev/null || echo 0; }

# HOST as a number: 2, h2, ppl-h2 or 10.250.0.2.
host_index() {
  local h=$1
  h=${h#"$PREFIX-"}
  h=${h#h}
  h=${h#"$SUBNET."}
  [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] && [ "$h" -le "$(count)" ] ||
    die "no host '$1' (the cluster has $(count) hosts; run 'cluster.sh up N' first)"
  echo "$h"
}

to_bytes() {
  local s=$1
  case "$s" in
    *[kK]) echo $(( ${s%?} * 1024 ));;
    *[mM]) echo $(( ${s%?} * 1024 * 1024 ));;
    *[gG]) echo $(( ${s%?} * 1024 * 1024 * 1024 ));;
    *) echo "$s";;
  esac
}

set_mem() {
  local i=$1 bytes dir
  bytes=$(to_bytes "$2")
  dir=$(cg_dir "$i")
  if [ -d "$cg1" ]; then
    echo "$bytes" > "$dir/memory.limit_in_bytes"
    # No swap here; where there is, the limit must bind swap too.
    [ -e "$dir/memory.memsw.limit_in_bytes" ] && echo "$bytes" > "$dir/memory.memsw.limit_in_bytes" || true
  else
    echo "$bytes" > "$dir/memory.max"
  fi
}

up() {
  local n=${1:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 16 ] || die "usage: cluster.sh up N (1 … 16) [--mem SIZE]"
  shift
  local mem=""
  if [ "${1:-}" = "--mem" ]; then mem=${2:?--mem needs a size}; fi
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces and cgroups)"
  command -v ip >/dev/null || die "ip not found: apt-get install iproute2"
  [ "$(count)" = 0 ] || down
  mkdir -p "$STATE"
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add "$BRIDGE" type bridge
  ip -n "$SWITCH" link set "$BRIDGE" up
  ip -n "$SWITCH" link set lo up
  for i in $(seq 1 "$n"); do
    local ns="$PREFIX-h$i"
    ip netns add "$ns"
    ip link add "eth0" netns "$ns" type veth peer name "p$i" netns "$SWITCH"
    ip -n "$SWITCH" link set "p$i" master "$BRIDGE"
    ip -n "$SWITCH" link set "p$i" up
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "$(cg_dir "$i")"
    [ -z "$mem" ] || set_mem "$i" "$mem"
  done
  echo "$n" > "$STATE/hosts"
  echo "cluster: $n hosts ($(hosts)) on $SWITCH/$BRIDGE${mem:+, $mem each}"
}

down() {
  local n i
  n=$(count)
  for i in $(seq 1 "$n"); do
    kill_host "$i" 2>/dev/null || true
    ip netns del "$PREFIX-h$i" 2>/dev/null || true
    rmdir "$(cg_dir "$i")" 2>/dev/null || true
  done
  ip netns del "$SWITCH" 2>/dev/null || true
  rm -rf "$STATE"
}

hosts() {
  local out="" i slots=${1:-1}
  for i in $(seq 1 "$(count)"); do out+="${out:+,}$SUBNET.$i:$slots"; done
  echo "$out"
}

# Runs "$@" on host $1: its cgroup, its network namespace, its hostname.
exec_on() {
  local i
  i=$(host_index "$1")
  shift
  local procs
  procs="$(cg_dir "$i")/cgroup.procs"
  [ -e "$procs" ] || die "host $i has no cgroup (run 'cluster.sh up' again)"
  echo $$ > "$procs"
  # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup tree from the
  # host's processes (and from the rsh agent that starts the next host's daemon).
  exec nsenter --net="/run/netns/$PREFIX-h$i" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$PREFIX-h$i" "$@"
}

kill_host() {
  local i pids
  i=$(host_index "$1")
  pids=$(ip netns pids "$PREFIX-h$i" 2>/dev/null || true)
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}

peak() {
  local i dir
  i=$(host_index "$1")
  dir=$(cg_dir "$i")
  if [ -e "$dir/memory.max_usage_in_bytes" ]; then cat "$dir/memory.max_usage_in_bytes"; else cat "$dir/memory.peak"; fi
}

# OpenMPI across the hosts. TCP only (no shared memory: every rank is on a host of its own as far
# as MPI knows), on the cluster's subnet. The out-of-band keepalive settings (`ppl launch` sets
# the same) make mpirun and the remote daemons give up on a lost host 5–15 s after ppl's own
# PPL_COMM_TIMEOUT would name it, instead of OpenMPI's default 8 minutes of silence (300 s idle +
# 9 probes × 20 s) — while the link is down, mpirun cannot reach the daemons to end the job.
mpirun_all() {
  local per_host=1 args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --per-host) per_host=$2; shift 2;;
      *) args+=("$1"); shift;;
    esac
  done
  [ "${1:-}" = "--" ] || die "usage: cluster.sh mpirun [-np N] [--per-host K] [ARGS] -- CMD …"
  shift
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  exec_on 1 mpirun --host "$(hosts "$per_host")" \
    --mca plm_rsh_agent "bash $SELF agent" \
    --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" \
    --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 5 \
    --mca oob_tcp_keepalive_probes $(( (${PPL_COMM_TIMEOUT:-600} + 5 + 4) / 5 )) \
    "${args[@]}" "$@"
}

# `ppl launch` on host 1 across all hosts: the same transport settings as `mpirun` above; ppl
# launch adds the keepalive settings itself and ends mpirun if it outlives an aborted job.
launch_all() {
  local per_host=1 ppl=${PPL_BIN:-ppl} n
  n=$(count)
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --per-host) per_host=$2; shift 2;;
      --hosts) n=$2; shift 2;;
      *) die "launch: unknown option '$1' (usage: launch [--hosts N] [--per-host K] -- PPL_ARGS)";;
    esac
  done
  [ "${1:-}" = "--" ] && shift
  [ "$n" -le "$(count)" ] || die "launch --hosts $n: the cluster has $(count) hosts"
  local hosts="" i
  for i in $(seq 1 "$n"); do hosts+="${hosts:+,}$SUBNET.$i"; done
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  exec_on 1 "$ppl" launch --hosts "$hosts" --nproc-per-node "$per_host" \
    "--mpirun-arg=--mca" "--mpirun-arg=plm_rsh_agent" "--mpirun-arg=bash $SELF agent" \
    "--mpirun-arg=--mca" "--mpirun-arg=btl" "--mpirun-arg=tcp,self" \
    "--mpirun-arg=--mca" "--mpirun-arg=btl_tcp_if_include" "--mpirun-arg=$SUBNET.0/24" \
    "--mpirun-arg=--mca" "--mpirun-arg=oob_tcp_if_include" "--mpirun-arg=$SUBNET.0/24" \
    -- "$@"
}

link_of() { echo "p$(host_index "$1")"; }

cmd=${1:-}
[ -n "$cmd" ] || die "usage: cluster.sh up N | down | exec HOST -- CMD | mpirun … -- CMD | launch … -- ARGS | cut HOST | heal [HOST] | slow HOST DELAY RATE | kill HOST | mem HOST SIZE | peak HOST | hosts"
shift
case "$cmd" in
  up) up "$@";;
  down) down;;
  hosts) hosts "${1:-1}";;
  exec)
    h=${1:?host}; shift
    [ "${1:-}" = "--" ] && shift
    exec_on "$h" "$@";;
  agent)
    # OpenMPI calls `AGENT [options] HOST CMD…`; ssh options it may pass are ignored.
    while [[ "${1:-}" == -* ]]; do shift; done
    h=${1:?host}; shift
    exec_on "$h" sh -c "$*";;
  mpirun) mpirun_all "$@";;
  launch) launch_all "$@";;
  cut)
    # The switch port leaves the bridge: the host keeps its carrier and its packets vanish, as
    # when a switch or a cable between racks fails (no error reaches either side at once).
    ip -n "$SWITCH" link set "$(link_of "${1:?host}")" nomaster;;
  heal)
    if [ -n "${1:-}" ]; then hs=$(host_index "$1"); else hs=$(seq 1 "$(count)"); fi
    for i in $hs; do
      ip -n "$SWITCH" link set "p$i" master "$BRIDGE"
      ip -n "$SWITCH" link set "p$i" up
      tc -n "$SWITCH" qdisc del dev "p$i" root 2>/dev/null || true
      tc -n "$PREFIX-h$i" qdisc del dev eth0 root 2>/dev/null || true
    done;;
  slow)
    i=$(host_index "${1:?host}"); delay=${2:?delay, e.g. 20ms}; rate=${3:?rate, e.g. 100mbit}
    # Both directions: the host's egress and the switch port's egress towards it.
    tc -n "$PREFIX-h$i" qdisc replace dev eth0 root netem delay "$delay" rate "$rate"
    tc -n "$SWITCH" qdisc replace dev "p$i" root netem delay "$delay" rate "$rate";;
  kill) kill_host "${1:?host}";;
  mem) set_mem "$(host_index "${1:?host}")" "${2:?size}";;
  peak) peak "${1:?host}";;
  *) die "unknown command '$cmd'";;
esac
