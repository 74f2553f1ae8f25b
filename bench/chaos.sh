#!/usr/bin/env bash
# bench/chaos.sh — issue 21 item 5: goodput under chaos, as torchft measures it.
#
# Runs the embedded trainer (examples/train.toml, a small model: --set overrides in
# bench/chaosbench/main.go) as 4 agents x 2 workers plus one spare agent (--nnodes=2:4) on this
# machine, over a three-member etcd of `gorun rendezvous serve` (members e0-e2, "hosted" by node
# slots 0-2), lease_ttl 2 s, join_timeout at its default (a spare waits as long as the job runs). First
# a fault-free run of DURATION, then, for each period T, a run of DURATION with one failure every
# T (the first at T/2), drawn from a seeded mix (SEED; each kind once in a random order before
# any repeats):
#   kill -9 of one worker       a random worker process of a random member node
#   kill -9 of a node           its agent, guard and workers at once
#   SIGSTOP of a node           agent and workers stopped (silent: sockets open); killed 5 s later
#   kill -9 of the aggregator's node   the agent holding the job's etcd `leader` key
#   kill -9 of the etcd leader's node  the raft leader member and the node of its slot; the
#                               member comes back 3 s later with its data dir
# A killed (or, after 5 s, stopped) node's slot gets a replacement agent 1 s later, as a SLURM
# requeue of the node would. Each run ends with SIGUSR1 (every worker checkpoints, exit 75).
#
# Then (STRAGGLER=1, the default outside smoke mode) two straggler runs of DURATION, no failure
# injected: one member node's workers slowed to a tenth of their speed (SIGSTOP 90 ms, SIGCONT
# 10 ms, in turn) from 10 s after the start, once without eviction and once with
# --evict-stragglers=10s (the spare takes the slowed node's place). It prints kept steps/s of
# both beside the fault-free run's and what eviction gained (slowed-with-eviction over
# slowed-without), and exits 1 if the run with eviction did not evict the slowed node or the
# run without did evict one.
#
# Per period it prints, per failure kind: the downtime (the last metrics record of the world the
# failure hit -> the first record of a later round, any world size, from metrics.jsonl times)
# and the steps lost (steps the recovery threw away: trained more than once); overall the
# effective training time (time on kept steps / wall time of training) beside the fault-free
# run's, kept steps per second against the fault-free run's, and whether the run's newest
# checkpoint is allclose (rtol 1e-5, atol 1e-6) to the fault-free run's at the same step.
# JSON=1 adds one JSON line per period at the end.
#
#   bench/chaos.sh                                  # DURATION=300 PERIODS="60 15" SEED=1
#   DURATION=120 PERIODS=15 JSON=1 bench/chaos.sh
#   GORUN_BIN=/path/to/gorun CKPT_EVERY=200 bench/chaos.sh
#   KEEP=/tmp/chaos bench/chaos.sh                  # keep logs, metrics and checkpoints there
#   SMOKE=1 bench/chaos.sh                          # CI: about a minute, exits 1 if it cannot inject
#
# SMOKE=1 is the smoke mode CI runs: a fault-free run of DURATION (default 3 s there), then one
# chaos run that injects each kind of failure once, each as soon as the job recovered from the
# one before (PERIODS is ignored); it exits 1, saying why, when a failure could not be
# injected (no worker found, no aggregator), a kind was never injected, or the job did not
# recover from one.
#
# About 3 x DURATION plus a minute; it keeps 10 processes training on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
SMOKE=${SMOKE:-0}
if [[ "$SMOKE" == 1 ]]; then DURATION=${DURATION:-3}; else DURATION=${DURATION:-300}; fi
PERIODS=${PERIODS:-60 15}
SEED=${SEED:-1}
CKPT_EVERY=${CKPT_EVERY:-200}

die() { echo "chaos.sh: $*" >&2; exit 1; }
[[ "$DURATION" =~ ^[1-9][0-9]*$ ]] || die "DURATION must be whole seconds, got '$DURATION'"
periods=
for p in $PERIODS; do
  [[ "$p" =~ ^[1-9][0-9]*$ ]] || die "PERIODS must be whole seconds, got '$p'"
  periods+=${periods:+,}${p}s
done
[[ -n "$periods" ]] || die "PERIODS is empty"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-chaos-bin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
gorun=${GORUN_BIN:-}
if [[ -z "$gorun" ]]; then
  gorun=$tmp/gorun
  go build -o "$tmp/" ./cmd/gorun ./cmd/gorun-worker || die "go build ./cmd/gorun ./cmd/gorun-worker failed"
fi
go build -o "$tmp/chaosbench" ./bench/chaosbench || die "go build ./bench/chaosbench failed"

args=(-gorun "$gorun" -toml examples/train.toml -duration "${DURATION}s" -periods "$periods" -seed "$SEED" -ckpt-every "$CKPT_EVERY")
[[ "${JSON:-0}" == 1 ]] && args+=(-json)
[[ "$SMOKE" == 1 ]] && args+=(-smoke)
# The straggler runs need slowAfter + evictAfter (20 s) of training at least: not in smoke mode.
if [[ "${STRAGGLER:-$((1 - SMOKE))}" == 1 ]]; then args+=(-straggler=true); else args+=(-straggler=false); fi
[[ -n "${KEEP:-}" ]] && args+=(-dir "$KEEP")
echo "chaos: gorun $(git describe --always --dirty 2>/dev/null || echo '?'), $(nproc) CPUs, DURATION=$DURATION PERIODS='$PERIODS' SMOKE=$SMOKE SEED=$SEED CKPT_EVERY=$CKPT_EVERY"
"$tmp/chaosbench" "${args[@]}"
