#!/usr/bin/env bash
# A one-node Slurm on this machine (munge + slurmctld + slurmd), to try and test
# `srun ppl eval …` and `ppl launch --launcher srun`. Debian's packages: slurmd slurmctld
# slurm-client munge (`up` installs them with apt-get when missing). Needs root.
#
#   slurm-local.sh up      configure and start it (idempotent), wait until the node is idle
#   slurm-local.sh down    stop the daemons
set -euo pipefail

conf=/etc/slurm/slurm.conf
die() { echo "slurm-local.sh: $*" >&2; exit 1; }

up() {
  [ "$(id -u)" = 0 ] || die "needs root"
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
    local pkgs=(slurmd slurmctld slurm-client munge)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; }
  fi
  local host cpus
  host=$(hostname)
  cpus=$(nproc)
  mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; }
  chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
  cat > "$conf" <<EOF
# Written by ppl's scripts/slurm-local.sh: one node, this machine.
ClusterName=ppl-local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  pgrep -x munged >/dev/null || munged --force 2>/dev/null || die "munged did not start"
  if ! pgrep -x slurmctld >/dev/null; then
    # This controller's state is ours alone: start clean (a saved state from another
    # configuration, e.g. another ClusterName, stops slurmctld at start-up).
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
    slurmctld || die "slurmctld did not start; see /var/log/slurm/slurmctld.log"
  fi
  pgrep -x slurmd >/dev/null || slurmd || die "slurmd did not start; see /var/log/slurm/slurmd.log"
  local i
  for i in $(seq 1 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "slurm: node $host up ($(sinfo -h -o '%P %t %c CPUs'))"
      return 0
    fi
    sleep 0.5
  done
  die "the node did not come up within 30 s; see /var/log/slurm/slurmctld.log and slurmd.log"
}

down() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  local i
  for i in $(seq 1 40); do
    pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || return 0
    sleep 0.25
  done
  pkill -9 -x slurmd 2>/dev/null || true
  pkill -9 -x slurmctld 2>/dev/null || true
}

case "${1:-}" in
  up) up;;
  down) down;;
  *) die "usage: slurm-local.sh up | down";;
esac
