#!/usr/bin/env bash
# Start a real Slurm cluster on this machine (Debian 12, as root, no systemd):
#   --nodes 1 (default): munged + [mariadbd + slurmdbd] + slurmctld + slurmd, all on localhost.
#   --nodes 2: the same controller on the host, and two slurmd "nodes" (node1, node2), each in its own
#              network and UTS namespace (own hostname and IP on a private bridge, 10.77.0.0/24, no route
#              out), so ranks on two nodes talk over real TCP between hosts. Tasks inherit their slurmd's
#              namespaces; files, CPUs and PIDs are shared, as on a cluster with a shared filesystem.
# Only one of the two runs at a time (same ports, same munge and MariaDB sockets, same /etc/slurm): starting
# one stops the other. stop_local.sh stops whichever runs.
# Idempotent: installs what is missing, (re)writes the config, starts only what is not running,
# then waits until every node is schedulable. Safe to call again when everything is up.
#
# Env knobs:
#   SLURM_CI_ROOT        state/log/pid dir (default /tmp/slurm-ci; the two-node cluster uses <root>-2nodes)
#   SLURM_CI_ACCOUNTING  1 = slurmdbd+mariadb (sacct works; submitit can see FAILED/CANCELLED/TIMEOUT
#                        states of jobs that wrote no result), 0 = no accounting (lighter)   (default 1)
#   SLURM_CI_CPUS        CPUs advertised per node; may exceed nproc (config_overrides) (default nproc)
#   SLURM_CI_NET         first three octets of the two-node cluster's private /24 (default 10.77.0)
# Recipe and its pitfalls (nsenter, no default route, %n paths): ../shared/reference/two_node/README.md,
# summarised in README.md "Slurm".
set -euo pipefail

NODE_COUNT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODE_COUNT=${2:-}; shift 2 ;;
    --nodes=*) NODE_COUNT=${1#--nodes=}; shift ;;
    *) echo "start_local.sh: unknown argument '$1'; usage: start_local.sh [--nodes 1|2]" >&2; exit 2 ;;
  esac
done
case "$NODE_COUNT" in
  1|2) ;;
  *) echo "start_local.sh: --nodes $NODE_COUNT: valid choices are 1 and 2" >&2; exit 2 ;;
esac

BASE=${SLURM_CI_ROOT:-/tmp/slurm-ci}
ACCT=${SLURM_CI_ACCOUNTING:-1}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
NET=${SLURM_CI_NET:-10.77.0}
HOST=$(hostname -s)
if [ "$NODE_COUNT" = 1 ]; then
  ROOT=$BASE; OTHER=$BASE-2nodes; CLUSTER=ci; CTLD_ADDR=127.0.0.1; NODES=("$HOST")
else
  ROOT=$BASE-2nodes; OTHER=$BASE; CLUSTER=twonode; CTLD_ADDR=$NET.1; NODES=(node1 node2)
fi
BRIDGE=abr0
MEM_MB=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 9 / 10 / NODE_COUNT ))
CONF_DIR=/etc/slurm
MYSQL_SOCK=/run/mysqld/mysqld.sock   # libmariadb's compiled-in default; slurmdbd uses it for StorageHost=localhost
log() { echo "[ablate slurm] $*"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }   # alive PIDFILE
node_addr() { if [ "$NODE_COUNT" = 1 ]; then echo 127.0.0.1; else echo "$NET.$((10 + $1))"; fi; }   # node_addr INDEX

# ---------------------------------------------------------------- 0. never a cluster this script did not start
# Another Slurm on this host (its own slurm.conf, or daemons this script did not start) is left alone: starting
# ours would rewrite its config and take its ports. Exit 3 says so in one line (the tests then skip theirs).
MARK="# written by ablate's slurm/start_local.sh"
ours_pid() { local p; for p in "$BASE"/run/*.pid "$BASE-2nodes"/run/*.pid; do [ -s "$p" ] && [ "$(cat "$p")" = "$1" ] && return 0; done; return 1; }
if [ -s "$CONF_DIR/slurm.conf" ] && ! head -1 "$CONF_DIR/slurm.conf" | grep -qF "$MARK"; then
  echo "start_local.sh: $CONF_DIR/slurm.conf was not written by this script: another Slurm is set up on this host; leaving it alone" >&2
  exit 3
fi
for d in slurmctld slurmd slurmdbd; do
  for p in $(pgrep -x "$d" 2>/dev/null); do
    ours_pid "$p" || { echo "start_local.sh: a $d (pid $p) this script did not start runs on this host: another Slurm; leaving it alone" >&2; exit 3; }
  done
done

# ---------------------------------------------------------------- 0b. one cluster of ours at a time
if alive "$OTHER/run/slurmctld.pid"; then
  log "the other local cluster ($OTHER) is running: stopping it first"
  bash "$(dirname "$0")/stop_local.sh"
fi

# ---------------------------------------------------------------- 1. packages
need=()
tools="munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client"
[ "$NODE_COUNT" = 2 ] && tools="$tools ip:iproute2 nsenter:util-linux"
for b in $tools; do
  command -v "${b%%:*}" >/dev/null 2>&1 || need+=("${b#*:}")
done
if [ "$ACCT" = 1 ]; then
  command -v slurmdbd >/dev/null 2>&1 || need+=(slurmdbd)
  command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
fi
if [ ${#need[@]} -gt 0 ]; then
  log "installing: ${need[*]}"
  # keep postinst scripts from trying to start the services (would fail: no slurm.conf yet)
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

# ---------------------------------------------------------------- 2. host names must resolve; two nodes: their network
if ! getent hosts "$HOST" >/dev/null; then
  log "adding $HOST to /etc/hosts"; echo "127.0.0.1 $HOST" >> /etc/hosts
fi
mkdir -p "$ROOT"/{state/ctld,run,log} "$CONF_DIR"
if [ "$NODE_COUNT" = 2 ]; then
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "creating bridge $BRIDGE $CTLD_ADDR/24"
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  for i in 1 2; do
    n=${NODES[$((i - 1))]}; ns=ablate-$n; addr=$(node_addr $i)
    if ! ip netns list | grep -qw "$ns"; then
      log "creating network namespace $ns ($n, $addr)"
      ip netns add "$ns"
      ip link add "abr${i}h" type veth peer name "abr${i}n"
      ip link set "abr${i}n" netns "$ns"
      ip link set "abr${i}h" master "$BRIDGE" up
      ip -n "$ns" link set "abr${i}n" name eth0
      ip -n "$ns" addr add "$addr/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      # Deliberately NO default route: a DNS lookup (glibc asks for node1's AAAA) then fails at once
      # instead of waiting ~10 s on an unreachable resolver; names resolve through /etc/hosts. The
      # nodes reach only this /24: tests never send traffic anywhere else.
    fi
    grep -qE "^$addr[[:space:]]+$n( |\$)" /etc/hosts || echo "$addr $n   # ablate-2nodes" >> /etc/hosts
  done
fi

# ---------------------------------------------------------------- 3. munge
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge; chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --force </dev/null >>"$ROOT/log/munged.out" 2>&1
  mkdir -p "$BASE"; touch "$BASE/munged.ours"   # stop_local.sh stops a munged only if this script started it
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null

# ---------------------------------------------------------------- 4. config
if [ "$ACCT" = 1 ]; then
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819"
else
  ACCT_LINES="AccountingStorageType=accounting_storage/none"
fi
NODE_LINES=""
for i in $(seq "$NODE_COUNT"); do
  n=${NODES[$((i - 1))]}
  NODE_LINES+="NodeName=$n NodeAddr=$(node_addr "$i") NodeHostname=$n CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"$'\n'
done
cat > "$CONF_DIR/slurm.conf.new" <<EOF
$MARK --nodes $NODE_COUNT
ClusterName=$CLUSTER
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$ACCT_LINES
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
# a loaded host (tests on every core) can take past the 60 s default to reap a killed step, and Slurm
# then drains the node ("Kill task failed") and every later job waits for it
UnkillableStepTimeout=180
InactiveLimit=0
MinJobAge=300
StateSaveLocation=$ROOT/state/ctld
SlurmdSpoolDir=$ROOT/state/slurmd-%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
${NODE_LINES}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
conf_changed=0
cmp -s "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf" || conf_changed=1
mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"
if [ "$conf_changed" = 1 ]; then   # config changed under running daemons: restart them below
  for pf in "$ROOT"/run/slurmd-*.pid "$ROOT/run/slurmctld.pid"; do
    if alive "$pf"; then
      pid=$(cat "$pf"); log "slurm.conf changed: restarting $(basename "$pf" .pid)"; kill -TERM "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
fi

# ---------------------------------------------------------------- 5. accounting: mariadb + slurmdbd
if [ "$ACCT" = 1 ]; then
  install -d -o mysql -g mysql "$ROOT/mysql" "$ROOT/run/mysql" /run/mysqld
  if [ ! -d "$ROOT/mysql/mysql" ]; then
    log "initialising mariadb datadir"
    mariadb-install-db --user=mysql --datadir="$ROOT/mysql" --auth-root-authentication-method=socket \
      --skip-test-db >"$ROOT/log/mariadb-install.log" 2>&1
  fi
  if ! mariadb-admin --socket=$MYSQL_SOCK ping >/dev/null 2>&1; then
    log "starting mariadbd"
    setsid mariadbd --no-defaults --user=mysql --datadir="$ROOT/mysql" --socket=$MYSQL_SOCK \
      --pid-file="$ROOT/run/mysql/mysqld.pid" --log-error="$ROOT/run/mysql/mysqld.err" \
      --skip-networking --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
    for _ in $(seq 100); do mariadb-admin --socket=$MYSQL_SOCK ping >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  mariadb --socket=$MYSQL_SOCK -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > "$CONF_DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$ROOT/log/slurmdbd.log
PidFile=$ROOT/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  if ! alive "$ROOT/run/slurmdbd.pid"; then
    log "starting slurmdbd"
    slurmdbd </dev/null >>"$ROOT/log/slurmdbd.out" 2>&1
  fi
  for _ in $(seq 100); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n show cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# ---------------------------------------------------------------- 6. slurmctld + slurmd
if ! alive "$ROOT/run/slurmctld.pid"; then
  log "starting slurmctld"
  slurmctld -i </dev/null >>"$ROOT/log/slurmctld.out" 2>&1
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
for i in $(seq "$NODE_COUNT"); do
  n=${NODES[$((i - 1))]}
  alive "$ROOT/run/slurmd-$n.pid" && continue
  mkdir -p "$ROOT/state/slurmd-$n"   # SlurmdSpoolDir: slurmd does not create it
  if [ "$NODE_COUNT" = 1 ]; then
    log "starting slurmd"
    slurmd </dev/null >>"$ROOT/log/slurmd.out" 2>&1
  else
    log "starting slurmd $n in network namespace ablate-$n"
    # nsenter, not `ip netns exec`: that remounts /sys for the namespace, hides /sys/fs/cgroup, and slurmd
    # dies with "Unable to initialize cgroup plugin". A new UTS namespace makes gethostname() == NodeName.
    nsenter --net="/run/netns/ablate-$n" unshare --uts sh -c "hostname $n && exec slurmd" \
      </dev/null >>"$ROOT/log/slurmd-$n.out" 2>&1
  fi
done

# ---------------------------------------------------------------- 7. wait for the nodes
ready() { [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | grep -cE ' (idle|mix|alloc|comp)$')" = "$NODE_COUNT" ]; }
for i in $(seq 150); do
  ready && break
  if sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(down|drain|drng|fail|inval)'; then
    [ $((i % 10)) = 1 ] && scontrol update nodename="$(IFS=,; echo "${NODES[*]}")" state=resume 2>/dev/null || true
  fi
  sleep 0.2
done
if ! ready; then
  log "nodes not ready; see $ROOT/log"; sinfo -N || true; sinfo -R || true; exit 1
fi
if [ "$ACCT" = 1 ]; then
  for _ in $(seq 50); do sacct -n -X -S now >/dev/null 2>&1 && break; sleep 0.2; done
fi
log "up: $NODE_COUNT node(s) ($(sinfo -h -N -o '%N=%t' | sort -u | tr '\n' ' ')) cpus/node=$CPUS mem/node=${MEM_MB}MB accounting=$ACCT"
