#!/usr/bin/env bash
# Stop the local Slurm cluster started by start_local.sh, whichever runs (one node or two), and undo the
# two-node cluster's network (namespaces, veths, bridge, /etc/hosts lines).
#   stop_local.sh          cancel jobs, stop daemons (state kept)
#   stop_local.sh --purge  also delete job state, accounting DB and logs
set -uo pipefail
BASE=${SLURM_CI_ROOT:-/tmp/slurm-ci}
BRIDGE=abr0
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

for ROOT in "$BASE" "$BASE-2nodes"; do
  [ -d "$ROOT" ] || continue
  # 1. cancel all jobs and give their steps a moment to go away (slurmstepd outlives slurmd otherwise)
  if [ -s "$ROOT/run/slurmctld.pid" ] && kill -0 "$(cat "$ROOT/run/slurmctld.pid")" 2>/dev/null; then
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
      log "cancelling jobs"; scancel --full -u root 2>/dev/null || true
      for _ in $(seq 100); do [ -z "$(squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  # 2. daemons, in reverse start order
  for pf in "$ROOT"/run/slurmd*.pid; do stop_pidfile "$(basename "$pf" .pid)" "$pf"; done
  stop_pidfile slurmctld "$ROOT/run/slurmctld.pid"
  stop_pidfile slurmdbd  "$ROOT/run/slurmdbd.pid"
  stop_pidfile mariadbd  "$ROOT/run/mysql/mysqld.pid"
  if [ "${1:-}" = "--purge" ]; then
    log "purging $ROOT/{state,mysql,log,run}"
    rm -rf "$ROOT/state" "$ROOT/mysql" "$ROOT/log" "$ROOT/run"
  fi
done
if [ -f "$BASE/munged.ours" ]; then   # (a munged this script did not start serves another Slurm: left alone)
  stop_pidfile munged /run/munge/munged.pid; rm -f "$BASE/munged.ours"
fi

# 3. the two-node network: what is left inside the namespaces (only what our slurmds started), then them
for ns in ablate-node1 ablate-node2; do
  ip netns list 2>/dev/null | grep -qw "$ns" || continue
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    log "stopping what is left in $ns: $pids"
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done; sleep 1
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  fi
  ip netns del "$ns" && log "deleted network namespace $ns"   # its veth goes with it, and so does the peer
done
for i in 1 2; do ip link del "abr${i}h" 2>/dev/null || true; done
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && log "deleted bridge $BRIDGE"; fi
# `ip netns add` bind-mounts /run/netns onto itself: undo that when no namespace is left in it
if [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then umount /run/netns 2>/dev/null; rmdir /run/netns 2>/dev/null; fi
if grep -q '# ablate-2nodes$' /etc/hosts; then   # rewrite in place: /etc/hosts may be a bind mount
  tmp=$(mktemp); grep -v '# ablate-2nodes$' /etc/hosts > "$tmp"; cat "$tmp" > /etc/hosts; rm -f "$tmp"
  log "removed the node lines from /etc/hosts"
fi
log "done"
