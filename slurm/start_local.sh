#!/usr/bin/env bash
# Start a real single-node Slurm cluster on this machine (Debian 12, as root, no systemd):
#   munged + [mariadbd + slurmdbd] + slurmctld + slurmd, all on localhost.
# Idempotent: installs what is missing, (re)writes the config, starts only what is not running,
# then waits until the node is schedulable. Safe to call again when everything is up.
#
# Env knobs:
#   SLURM_CI_ROOT        state/log/pid dir              (default /tmp/slurm-ci)
#   SLURM_CI_ACCOUNTING  1 = slurmdbd+mariadb (sacct works; submitit can see FAILED/CANCELLED/TIMEOUT
#                        states of jobs that wrote no result), 0 = no accounting (lighter)   (default 1)
#   SLURM_CI_CPUS        CPUs advertised for the node; may exceed nproc (config_overrides) (default nproc)
set -euo pipefail

ROOT=${SLURM_CI_ROOT:-/tmp/slurm-ci}
ACCT=${SLURM_CI_ACCOUNTING:-1}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
NODE=$(hostname -s)
MEM_MB=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 9 / 10 ))
CONF_DIR=/etc/slurm
MYSQL_SOCK=/run/mysqld/mysqld.sock   # libmariadb's compiled-in default; slurmdbd uses it for StorageHost=localhost
log() { echo "[ablate slurm] $*"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }   # alive PIDFILE

# ---------------------------------------------------------------- 1. packages
need=()
for b in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
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

# ---------------------------------------------------------------- 2. host name must resolve
if ! getent hosts "$NODE" >/dev/null; then
  log "adding $NODE to /etc/hosts"; echo "127.0.0.1 $NODE" >> /etc/hosts
fi

mkdir -p "$ROOT"/{state/ctld,state/d,run,log} "$CONF_DIR"

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
cat > "$CONF_DIR/slurm.conf.new" <<EOF
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
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
InactiveLimit=0
MinJobAge=300
StateSaveLocation=$ROOT/state/ctld
SlurmdSpoolDir=$ROOT/state/d
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
conf_changed=0
cmp -s "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf" || conf_changed=1
mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"
if [ "$conf_changed" = 1 ]; then   # config changed under running daemons: restart them below
  for d in slurmd slurmctld; do
    if alive "$ROOT/run/$d.pid"; then
      pid=$(cat "$ROOT/run/$d.pid"); log "slurm.conf changed: restarting $d"; kill -TERM "$pid"
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
  sacctmgr -n show cluster format=cluster | grep -qw ci || sacctmgr -i add cluster ci >/dev/null
fi

# ---------------------------------------------------------------- 6. slurmctld + slurmd
if ! alive "$ROOT/run/slurmctld.pid"; then
  log "starting slurmctld"
  slurmctld -i </dev/null >>"$ROOT/log/slurmctld.out" 2>&1
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
if ! alive "$ROOT/run/slurmd.pid"; then
  log "starting slurmd"
  slurmd </dev/null >>"$ROOT/log/slurmd.out" 2>&1
fi

# ---------------------------------------------------------------- 7. wait for the node
state=""
for i in $(seq 150); do
  state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mix|alloc|comp) break ;;
    down*|drain*|drng*|fail*|inval*) [ $((i % 10)) = 1 ] && scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.2
done
case "$state" in
  idle|mix|alloc|comp) ;;
  *) log "node $NODE not ready (state='$state'); see $ROOT/log"; sinfo -R || true; exit 1 ;;
esac
if [ "$ACCT" = 1 ]; then
  for _ in $(seq 50); do sacct -n -X -S now >/dev/null 2>&1 && break; sleep 0.2; done
fi
log "up: node $NODE state=$state cpus=$CPUS mem=${MEM_MB}MB accounting=$ACCT"
