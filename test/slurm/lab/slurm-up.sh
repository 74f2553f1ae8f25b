#!/usr/bin/env bash
# slurm-up.sh — a real, throwaway, multi-node SLURM 22.05 cluster on ONE Debian 12
# host (no systemd, no cgroups), for gorun's integration tests (test/slurm).
# Adapted from the shared lab's script: the node subnet and the first job id
# are settable, so that this cluster's node addresses and the ports gorun
# derives from job ids do not meet another lab cluster on the same machine.
#
# Usage:  lab/slurm-up.sh [NODES]            (default 2; 1..50)
# Env:    LAB_DIR=/tmp/lab                   everything lives in $LAB_DIR/slurm
#         LAB_SLURM_CPUS=4                   CPUs advertised per node (config_overrides,
#                                            so more than the host really has is fine)
#         LAB_SLURM_NET=127.0.100            node<i> is $LAB_SLURM_NET.<i>
#         LAB_SLURM_FIRST_JOB_ID=1           the cluster's first job id
# Prints (last stdout line):  export SLURM_CONF=/tmp/lab/slurm/slurm.conf
# Also writes $LAB_DIR/slurm/cluster.env (SLURM_CONF, NODES, ports, pids).
#
# How "several nodes on one host" works (all traffic stays on loopback):
#   * one munged (own key + socket under $LAB_DIR/slurm/munge, AuthInfo=socket=...)
#   * one slurmctld on 127.0.0.1:<random port>
#   * per node i: `slurmd -D -N node<i>` started inside its own UTS + mount
#     namespace (`unshare --uts --mount`): hostname is node<i>, and a private
#     /etc/hosts is bind-mounted there mapping node<i> -> $LAB_SLURM_NET.<i>
#     (all of 127/8 is local on Linux). Each node has its own slurmd Port=.
#     Every job step / task inherits those namespaces, so inside a job
#     `hostname` == $SLURMD_NODENAME and `getent hosts node2` works.
#   * Network namespace is shared (loopback): nodes share one TCP port space.
# Idempotent: if a cluster with the same NODES count is up and idle-capable, it is
# reused; otherwise the old one (ours only) is torn down first.
# Tear down with lab/slurm-down.sh.
set -euo pipefail

NODES="${1:-${LAB_SLURM_NODES:-2}}"
[[ "$NODES" =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 50)) || { echo "NODES must be 1..50" >&2; exit 2; }
LAB_DIR="${LAB_DIR:-/tmp/lab}"
S="$LAB_DIR/slurm"
CPUS="${LAB_SLURM_CPUS:-4}"
NET="${LAB_SLURM_NET:-127.0.100}"
[[ "$NET" =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "LAB_SLURM_NET must look like 127.X.Y" >&2; exit 2; }
FIRST_JOB_ID="${LAB_SLURM_FIRST_JOB_ID:-1}"
[[ "$FIRST_JOB_ID" =~ ^[1-9][0-9]{0,8}$ ]] || { echo "LAB_SLURM_FIRST_JOB_ID must be a number >= 1" >&2; exit 2; }
T0=$(date +%s.%N)

# ---------------------------------------------------------------- packages
need=()
for c in slurmctld slurmd srun munged; do command -v "$c" >/dev/null 2>&1 || need+=("$c"); done
if ((${#need[@]})); then
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then   # never let apt start system munge/slurm services
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmctld slurmd slurm-client munge >&2
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
fi
command -v unshare >/dev/null && command -v nsenter >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux >&2; }

# ---------------------------------------------------------------- helpers
is_ours() { # pid needle : pid alive and its cmdline contains needle
  [[ -n "${1:-}" && -r /proc/$1/cmdline ]] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q -- "$2"
}
sctl() { SLURM_CONF="$S/slurm.conf" "$@"; }
all_idle() {
  local n
  n=$(sctl sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /^(idle|mixed|allocated)/' | sort -u | wc -l)
  [[ "$n" == "$NODES" ]]
}

# ---------------------------------------------------------------- idempotency
if [[ -f "$S/cluster.env" ]]; then
  # shellcheck disable=SC1091
  . "$S/cluster.env"
  if [[ "${LAB_SLURM_NODES_UP:-}" == "$NODES" ]] && is_ours "${CTLD_PID:-}" "$S/slurm.conf" &&
     sctl scontrol ping 2>/dev/null | grep -q 'is UP' && all_idle; then
    echo "slurm-up: cluster with $NODES node(s) already up" >&2
    echo "export SLURM_CONF=$S/slurm.conf"
    exit 0
  fi
fi
if [[ -d "$S" ]]; then
  # tear down whatever of ours is left (same logic as slurm-down.sh)
  SLURM_DOWN="$(dirname "$0")/slurm-down.sh"
  if [[ -x "$SLURM_DOWN" ]]; then LAB_DIR="$LAB_DIR" "$SLURM_DOWN" >&2; else rm -rf "$S"; fi
fi
mkdir -p "$S"/{munge,state,spool,log,run}
chmod 711 "$S/munge"    # munged insists: socket dir must be executable by all

STARTED=()
cleanup_on_fail() {
  local rc=$?
  if ((rc != 0)); then
    echo "slurm-up: FAILED rc=$rc; stopping what this run started: ${STARTED[*]:-none}" >&2
    for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; done
    tail -n 15 "$S"/log/*.out >&2 2>/dev/null || true
  fi
}
trap cleanup_on_fail EXIT

# ---------------------------------------------------------------- ports
port_free() { ! ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }
pick_base() { # need NODES+1 consecutive free ports
  local b i ok
  for _ in $(seq 1 200); do
    b=$((20000 + (RANDOM * 32768 + RANDOM) % 30000)); ok=1
    for ((i = 0; i <= NODES; i++)); do port_free $((b + i)) || { ok=0; break; }; done
    ((ok)) && { echo "$b"; return 0; }
  done
  return 1
}
BASE=$(pick_base)
CTLD_PORT=$BASE

# ---------------------------------------------------------------- munge
dd if=/dev/urandom of="$S/munge/munge.key" bs=128 count=1 status=none
chmod 400 "$S/munge/munge.key"
setsid munged --foreground --force --socket="$S/munge/munge.sock" --key-file="$S/munge/munge.key" \
  --pid-file="$S/munge/munged.pid" --log-file="$S/log/munged.log" --seed-file="$S/munge/munged.seed" \
  </dev/null >"$S/log/munged.out" 2>&1 &
MUNGE_PID=$!; STARTED+=("$MUNGE_PID")
for _ in $(seq 1 50); do [[ -S "$S/munge/munge.sock" ]] && break; sleep 0.1; done
munge -S "$S/munge/munge.sock" -n | unmunge -S "$S/munge/munge.sock" >/dev/null

# ---------------------------------------------------------------- config
{
  echo "127.0.0.1 localhost"
  for ((i = 1; i <= NODES; i++)); do echo "$NET.$i node$i"; done
  echo "::1 localhost ip6-localhost ip6-loopback"
} >"$S/hosts"

cat >"$S/slurm.conf" <<EOF
# generated by slurm-up.sh ($NODES nodes)
ClusterName=lab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((BASE + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
MinJobAge=600
FirstJobId=$FIRST_JOB_ID
EOF
for ((i = 1; i <= NODES; i++)); do
  echo "NodeName=node$i NodeHostname=node$i NodeAddr=$NET.$i Port=$((BASE + i)) CPUs=$CPUS RealMemory=2000 State=UNKNOWN" >>"$S/slurm.conf"
done
echo "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$S/slurm.conf"

# ---------------------------------------------------------------- daemons
setsid slurmctld -D -i -f "$S/slurm.conf" </dev/null >"$S/log/slurmctld.out" 2>&1 &
CTLD_PID=$!; STARTED+=("$CTLD_PID")
for _ in $(seq 1 100); do sctl scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
sctl scontrol ping | grep -q 'is UP'

SLURMD_PIDS=()
for ((i = 1; i <= NODES; i++)); do
  mkdir -p "$S/spool/node$i"
  # own UTS+mount namespace: hostname node<i>, private /etc/hosts; exec => $! is slurmd
  setsid unshare --uts --mount --propagation private -- /bin/bash -c \
    'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -D -N "$2" -f "$3"' \
    _ "$S/hosts" "node$i" "$S/slurm.conf" </dev/null >"$S/log/slurmd-node$i.out" 2>&1 &
  p=$!; STARTED+=("$p"); SLURMD_PIDS+=("$p")
done
sleep 0.2
for ((i = 1; i <= NODES; i++)); do   # remember each node's namespace (for slurm-down / failure tests)
  readlink "/proc/${SLURMD_PIDS[i - 1]}/ns/uts" >"$S/run/node$i.utsns"
  echo "${SLURMD_PIDS[i - 1]}" >"$S/run/node$i.pid"
done
for _ in $(seq 1 150); do all_idle && break; sleep 0.1; done
all_idle || { sctl sinfo -N >&2; exit 1; }

T1=$(date +%s.%N)
UP_S=$(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.2f", b-a}')
cat >"$S/cluster.env" <<EOF
SLURM_CONF=$S/slurm.conf
LAB_SLURM_NODES_UP=$NODES
CTLD_PORT=$CTLD_PORT
CTLD_PID=$CTLD_PID
MUNGE_PID=$MUNGE_PID
MUNGE_SOCKET=$S/munge/munge.sock
SLURMD_PIDS="${SLURMD_PIDS[*]}"
SLURM_HOSTS_FILE=$S/hosts
LAB_SLURM_NET=$NET
UP_SECONDS=$UP_S
EOF
echo "$UP_S" >"$S/up.seconds"
STARTED=()
echo "slurm-up: $NODES node(s) idle after ${UP_S}s; ctld 127.0.0.1:$CTLD_PORT; logs $S/log" >&2
sctl sinfo -N >&2
echo "export SLURM_CONF=$S/slurm.conf"
