#!/usr/bin/env bash
# A real single-node Slurm from Debian's packages, no systemd: munge, mariadb + slurmdbd (accounting, which
# submitit needs to see a killed job end), slurmctld and slurmd. Partition `debug` (the default) holds the node;
# a job in partition `urgent` preempts (cancels) what it needs room from, to test preemption. Run as root.
#   GPU node (/dev/nvidia0 exists): its real GPUs, $(nproc) CPUs.
#   Otherwise: SLURM_FAKE_GPUS fake GPUs (default 8; character devices, so CPU-only jobs run) and 16 CPUs.
#   SLURM_CPUS overrides the CPU count either way.
# Idempotent: starts only what is not running; exits at once when everything already is.
# Stop it with scripts/slurm_down.sh.
set -euo pipefail

if [ -e /dev/nvidia0 ] && [ -z "${SLURM_FAKE_GPUS:-}" ]; then
  GPUS=$(ls /dev | grep -cE '^nvidia[0-9]+$'); GPU_FILES=/dev/nvidia; GPU_TYPE=gpu; CPUS=${SLURM_CPUS:-$(nproc)}
else
  GPUS=${SLURM_FAKE_GPUS:-8}; GPU_FILES=/run/fakegpu/nvidia; GPU_TYPE=fake; CPUS=${SLURM_CPUS:-16}
fi
HOST=$(hostname -s)
ETC=/etc/slurm
START_MS=$(( $(date +%s%N) / 1000000 ))

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() {  # wait_for SECONDS COMMAND...: retry COMMAND every 0.25 s
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "slurm_up: timed out waiting for: $*" >&2; return 1; }
    sleep 0.25
  done
}
node_ready() { sinfo -h -n "$HOST" -o %T | grep -qxE 'idle|mixed|allocated'; }
PIDS="/run/munge/munged.pid /run/mysqld/mysqld.pid /run/slurmdbd.pid /run/slurmctld.pid /run/slurmd.pid"

all_alive=1
for pid in $PIDS; do alive "$pid" || all_alive=0; done
if [ "$all_alive" = 1 ] && timeout 10 sinfo -h >/dev/null 2>&1 && node_ready; then
  echo "slurm_up: already running"; exit 0
fi

PKGS="munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi

mkdir -p /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$ETC"
chown munge:munge /run/munge

# munge: the package made /etc/munge/munge.key; make one if it did not
[ -s /etc/munge/munge.key ] || { mungekey -c -f; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
alive /run/munge/munged.pid || su -s /bin/sh munge -c /usr/sbin/munged
wait_for 10 sh -c 'munge -n | unmunge'

# mariadb + slurmdbd (accounting)
bash "$(dirname "$0")/mariadb_up.sh" "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
cat > "$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
chmod 600 "$ETC/slurmdbd.conf"

GRES=""
if [ "$GPUS" -gt 0 ]; then
  if [ "$GPU_TYPE" = fake ]; then  # NVIDIA's major number: slurmd refuses plain files
    mkdir -p /run/fakegpu
    for i in $(seq 0 $((GPUS - 1))); do [ -e /run/fakegpu/nvidia$i ] || mknod /run/fakegpu/nvidia$i c 195 "$i"; done
  fi
  printf 'AutoDetect=off\nNodeName=%s Name=gpu Type=%s File=%s[0-%d]\n' "$HOST" "$GPU_TYPE" "$GPU_FILES" $((GPUS - 1)) > "$ETC/gres.conf"
  GRES="Gres=gpu:$GPU_TYPE:$GPUS"
fi
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
cat > "$ETC/slurm.conf" <<EOF
ClusterName=kbsweep
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
# a job array's tasks start as others end (batch_sched_delay's default 3 s made them start in waves 3 s apart)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
SlurmdParameters=config_overrides
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
AccountingStorageTRES=gres/gpu
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB $GRES State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$HOST MaxTime=INFINITE State=UP PriorityTier=2
EOF

alive /run/slurmdbd.pid || /usr/sbin/slurmdbd
wait_for 30 sh -c 'sacctmgr -i add cluster kbsweep >/dev/null 2>&1; sacctmgr -n -P list cluster format=cluster | grep -qx kbsweep'
alive /run/slurmctld.pid || /usr/sbin/slurmctld
alive /run/slurmd.pid || /usr/sbin/slurmd
wait_for 30 sinfo -h
if sinfo -h -n "$HOST" -o %T | grep -qE 'drain|down'; then scontrol update nodename="$HOST" state=resume || true; fi
wait_for 30 node_ready
echo -n "slurm_up: ready in $(( $(date +%s%N) / 1000000 - START_MS )) ms: "
sinfo -h -o '%P %N %T cpus=%c %G'
