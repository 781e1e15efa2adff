#!/usr/bin/env bash
# Start a single-node Slurm "cluster" (munged + slurmctld + slurmd) without systemd
# (as in a container). State, config, logs and pid files live in $SLURM_CI_DIR.
# Env: SLURM_CI_DIR (default /tmp/slurm-ci), SLURM_CI_CPUS (CPUs advertised, default nproc),
#      SLURM_CI_CTLD_PORT / SLURM_CI_SLURMD_PORT (default 6817 / 6818).
# Prints "export SLURM_CONF=..." as its last line; clients (sbatch, srun, sinfo) need it.
# Stop with scripts/slurm-down.sh (same SLURM_CI_DIR).
set -euo pipefail
SLURM_CI_DIR=${SLURM_CI_DIR:-/tmp/slurm-ci}
NCPUS=${SLURM_CI_CPUS:-$(nproc)}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_CI_SLURMD_PORT:-6818}
mkdir -p "$SLURM_CI_DIR"/{state,spool,log}

for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm-up: $tool not installed (apt-get install slurm-wlm munge)" >&2; exit 1; }
done

# --- munge: reuse a running daemon, else start one and remember that we did ---
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  cp /run/munge/munged.pid "$SLURM_CI_DIR/munged.pid"   # slurm-down stops only a munged we started
fi
munge -n | unmunge >/dev/null

cat > "$SLURM_CI_DIR/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$SLURM_CI_DIR/state
SlurmdSpoolDir=$SLURM_CI_DIR/spool
SlurmctldPidFile=$SLURM_CI_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_CI_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_CI_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_CI_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MinJobAge=5
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$NCPUS Sockets=1 CoresPerSocket=$NCPUS ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$SLURM_CI_DIR/slurm.conf"

slurmctld -c -f "$SLURM_CONF"
slurmd -N localhost -f "$SLURM_CONF"
for _ in $(seq 1 150); do
  sinfo -h -o '%T' 2>/dev/null | grep -qx idle && break
  sleep 0.2
done
if ! sinfo -h -o '%T' | grep -qx idle; then
  echo "slurm-up: slurm did not come up" >&2
  tail -n 20 "$SLURM_CI_DIR"/log/*.log >&2
  exit 1
fi
echo "export SLURM_CONF=$SLURM_CONF"
