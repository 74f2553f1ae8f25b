#!/bin/sh
# Kill -9 one of three nodes of a training job at a chosen step and watch the
# other two finish it; then compare the final checkpoint with a fault-free
# run of two nodes. Everything runs on this machine over 127.0.0.1.
#
#   examples/fault/run.sh            # kill node-c at step 25 of 60
#   KILL_AT=40 STEPS=80 examples/fault/run.sh
#
# GORUN names the binary (default: gorun on PATH, else bin/gorun); WORK the
# directory for checkpoints, metrics and logs (default: a new temp dir).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
toml="$here/../train.toml"
GORUN=${GORUN:-$(command -v gorun || echo "$here/../../bin/gorun")}
STEPS=${STEPS:-60}
KILL_AT=${KILL_AT:-25}
PORT=${PORT:-23790}
WORK=${WORK:-$(mktemp -d /tmp/gorun-fault.XXXXXX)}
mkdir -p "$WORK"
# 48 sequences a step divide into micro batches of 4 on 6 and on 4 workers.
sets="--set train.steps=$STEPS --set train.global_batch=48 --set train.micro_batch=4 --set train.log_every=1 --set checkpoint.every=0"
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

"$GORUN" rendezvous serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/etcd" >"$WORK/etcd.log" 2>&1 &
pids="$!"
sleep 1

# agent RUN NNODES NAME: one node of 2 workers of run RUN in the background.
agent() {
	# shellcheck disable=SC2086
	"$GORUN" --nnodes="$2" --nproc-per-node=2 --rdzv-backend=etcd --rdzv-endpoint="127.0.0.1:$PORT" \
		--rdzv-id="$1" --node-name="$3" --local-addr=127.0.0.1 --max-restarts=3 --log-format=json \
		--rdzv-conf=lease_ttl=2,last_call_timeout=10 "$toml" $sets \
		--set "checkpoint.dir=\"$WORK/$1\"" --metrics "$WORK/$1.jsonl" >"$WORK/$1-$3.out" 2>"$WORK/$1-$3.err" &
}

echo "== reference: 2 nodes x 2 workers, no fault ($WORK/ref)"
agent ref 2 node-a; a=$!; agent ref 2 node-b; b=$!
wait $a $b

echo "== faulty run: 3 nodes x 2 workers, kill -9 of node-c at step $KILL_AT"
agent job 2:3 node-a; a=$!; agent job 2:3 node-b; b=$!; agent job 2:3 node-c; c=$!
pids="$pids $a $b $c"
until grep -q "\"step\":$KILL_AT," "$WORK/job.jsonl" 2>/dev/null; do sleep 0.01; done
kill -9 "$c"
echo "killed node-c (pid $c) at $(date +%T.%N | cut -c1-12); its workers die with it"
wait $a $b
grep -h '"message":"round ended\|"to":"running"\|^gorun: round' "$WORK"/job-node-a.err "$WORK"/job-node-b.err | cut -c1-200
grep -h "resuming at step\|in place\|done:" "$WORK"/job-node-*.out || true
echo "last metrics record: $(tail -n 1 "$WORK/job.jsonl")"
"$GORUN" status --rdzv-endpoint="127.0.0.1:$PORT" --rdzv-id=job

echo "== gorun ckpt diff --rtol 1e-5 --atol 1e-6 (the fault-free run at world size 4 vs the job that lost a node: 6, then 4)"
"$GORUN" ckpt diff --rtol 1e-5 --atol 1e-6 "$WORK/ref" "$WORK/job" 2>&1 | tail -n 1
