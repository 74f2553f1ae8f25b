#!/usr/bin/env bash
# bench/pytorch-chaos.sh — issue 33's goals: what a failure costs a PyTorch DDP job, three ways (and a fourth).
#
# Trains examples/pytorch/snapshots.py (a model of MODEL_MB megabytes, 100: 26M parameters) as a
# DDP job of 3 nodes x NPROC workers (CPU, gloo) on this machine, STEPS steps, four ways in one
# invocation:
#   torchrun+ckpt     torchrun (python3 -m torch.distributed.run, c10d hosted by node 0's agent)
#                     and the script's torch.save checkpoint every CKPT_EVERY steps
#   gorun+ckpt        gorun agents (--nnodes=3, over a `gorun rendezvous serve` etcd), the same
#                     checkpoint, --snapshots=false
#   gorun+snapshots   gorun with snapshots every step (--snapshot-replicas REPLICAS), no checkpoint
#   gorun+warm        gorun+snapshots with --warm-workers: a restarted worker is an interpreter
#                     that imported torch ahead of the round
# First a fault-free run (gorun, no checkpoint, no snapshot). In each way's run one failure every
# PERIOD seconds of training on average (each a time drawn from PERIOD/2 to 3*PERIOD/2, seeded and
# the same for every way, after the first step or after the first step after the one before, so
# that failures fall anywhere in a checkpoint interval; none before the first checkpoint; MAX_FAULTS, 8, at most:
# then the way trains to its end, as a checkpoint way that redoes up to CKPT_EVERY steps after each
# failure might not), drawn from kill -9 of a worker and kill -9 of a whole node (its
# agent's process tree: agent, guard, workers; /dev/shm/gorun-<run id>-* of dead agents removed
# by the bench at the end). A killed node's slot gets a new agent 1 s later, as a SLURM requeue
# would, so that the world (and the data order) stays the same. torchrun never loses node 0: its
# agent holds the c10d store.
#
# Per way it prints, from rank 0's `step N loss L` lines (stamped as the driver reads them) and
# the fault times: the steps redone per failure and the seconds from the failure to the first step
# after it (per kind), the median step, the snapshot cost per step (the snapshot way's median step
# over the fault-free run's), the effective training time (time on kept steps / wall time, from
# the first step to the last), and `bit-identical: yes/no` (the final --out against the fault-free
# run's, bit for bit); beside them a snapshot's save and restore GB/s and this machine's memcpy
# (python/bench_snapshots.py at MODEL_MB). JSON=1 adds one JSON object per way.
# COST_RUNS=N (default 0; 1 with SMOKE=1) also measures the snapshot cost per step with N more
# fault-free runs of the snapshot way whose script saves only in every other block of 4 steps
# (--save-blocks 4): the median step after which it saved against the median step after which it
# did not, and rank 0's CPU time per step the same way (rank 0 saves its node's snapshot), all
# within one run; each run's figures and their median. The table's cost compares two runs minutes
# apart, and on a shared VM the median step of one configuration moves by 10-30 % between runs.
#
#   bench/pytorch-chaos.sh                    # MODEL_MB=100 STEPS=60 CKPT_EVERY=10 PERIOD=20 NPROC=2
#   WAYS=gorun+ckpt,gorun+snapshots JSON=1 bench/pytorch-chaos.sh
#   KEEP=/tmp/pychaos bench/pytorch-chaos.sh  # keep the logs (every line stamped) and the models
#   WAYS=gorun+snapshots PERIOD=100000 STEPS=40 COST_RUNS=3 bench/pytorch-chaos.sh   # the cost alone
#   SMOKE=1 bench/pytorch-chaos.sh            # CI: under a minute
#
# SMOKE=1: a 2 MB model, 3 nodes x 1 worker, 60 steps, the snapshot way with warm workers only (WAYS), one failure
# of each kind, each as soon as the job recovered from the one before; exit 1 when a kind was not
# injected, a failure was not recovered from, or the final model is not bit-identical. No timing
# is judged.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init pytorch-chaos.sh
if [[ "$SMOKE" == 1 ]]; then
  MODEL_MB=${MODEL_MB:-2} STEPS=${STEPS:-60} CKPT_EVERY=${CKPT_EVERY:-4} NPROC=${NPROC:-1} WAYS=${WAYS:-gorun+warm}
  COST_RUNS=${COST_RUNS:-1}
fi
MODEL_MB=${MODEL_MB:-100} STEPS=${STEPS:-60} CKPT_EVERY=${CKPT_EVERY:-10} PERIOD=${PERIOD:-20} NPROC=${NPROC:-2}
SEED=${SEED:-1} MAX_FAULTS=${MAX_FAULTS:-8} REPLICAS=${REPLICAS:-1} COST_RUNS=${COST_RUNS:-0} WAYS=${WAYS:-torchrun+ckpt,gorun+ckpt,gorun+snapshots,gorun+warm}
PYTHON=${PYTHON:-/usr/bin/python3}
bench_positive MODEL_MB STEPS CKPT_EVERY PERIOD NPROC SEED MAX_FAULTS
[[ "$REPLICAS" =~ ^[0-9]+$ ]] || die "REPLICAS must be 0 or a positive integer, got '$REPLICAS'"
[[ "$COST_RUNS" =~ ^[0-9]+$ ]] || die "COST_RUNS must be 0 or a positive integer, got '$COST_RUNS'"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON has no torch (Debian: apt-get install python3-torch; or set PYTHON)"
bench_gorun
(cd "$root" && go build -o "$tmp/torchchaos" ./bench/torchchaos) || die "go build ./bench/torchchaos failed"

args=(-gorun "$gorun" -python "$PYTHON" -script "$root/examples/pytorch/snapshots.py" -model-mb "$MODEL_MB" -steps "$STEPS"
  -ckpt-every "$CKPT_EVERY" -period "${PERIOD}s" -max-faults "$MAX_FAULTS" -nproc "$NPROC" -seed "$SEED" -snapshot-replicas "$REPLICAS" -ways "$WAYS" -cost-runs "$COST_RUNS")
[[ "${JSON:-0}" == 1 ]] && args+=(-json)
[[ "$SMOKE" == 1 ]] && args+=(-smoke)
[[ -n "${KEEP:-}" ]] && args+=(-dir "$KEEP")
echo "pytorch-chaos: gorun $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?'), $(nproc) CPUs, MODEL_MB=$MODEL_MB STEPS=$STEPS CKPT_EVERY=$CKPT_EVERY PERIOD=$PERIOD NPROC=$NPROC SEED=$SEED MAX_FAULTS=$MAX_FAULTS REPLICAS=$REPLICAS COST_RUNS=$COST_RUNS WAYS=$WAYS SMOKE=$SMOKE"
"$tmp/torchchaos" "${args[@]}"
