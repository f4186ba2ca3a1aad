#!/usr/bin/env bash
# Stop the single-node Slurm cluster started by start_local.sh.
#   stop_local.sh          cancel jobs, stop daemons (state kept)
#   stop_local.sh --purge  also delete job state, accounting DB and logs
set -uo pipefail
ROOT=${SLURM_CI_ROOT:-/tmp/slurm-ci}
log() { echo "[ablate slurm] $*"; }

stop_pidfile() {  # stop_pidfile NAME PIDFILE
  local name=$1 pf=$2 pid
  [ -s "$pf" ] || return 0
  pid=$(cat "$pf")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "$name still alive, SIGKILL"; kill -KILL "$pid" 2>/dev/null; }
  fi
  rm -f "$pf"
}

# 1. cancel all jobs and give their steps a moment to go away (slurmstepd outlives slurmd otherwise)
if [ -s "$ROOT/run/slurmctld.pid" ] && kill -0 "$(cat "$ROOT/run/slurmctld.pid")" 2>/dev/null; then
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    log "cancelling jobs"; scancel --full -u root 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# 2. daemons, in reverse start order
stop_pidfile slurmd    "$ROOT/run/slurmd.pid"
stop_pidfile slurmctld "$ROOT/run/slurmctld.pid"
stop_pidfile slurmdbd  "$ROOT/run/slurmdbd.pid"
stop_pidfile mariadbd  "$ROOT/run/mysql/mysqld.pid"
stop_pidfile munged    /run/munge/munged.pid

if [ "${1:-}" = "--purge" ]; then
  log "purging $ROOT/{state,mysql,log,run}"
  rm -rf "$ROOT/state" "$ROOT/mysql" "$ROOT/log" "$ROOT/run"
fi
log "done"
