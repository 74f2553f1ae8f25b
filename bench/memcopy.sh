#!/usr/bin/env bash
# bench/memcopy.sh — the cost per step of [checkpoint] memory copies, off and on side by side in one run.
#
# Trains the model of a train.toml (TOML, default examples/train.toml: 2 layers, d_model 64, context 64,
# global batch 32, its builtin:corpus) as a job of two nodes on this machine: two gorun agents with the
# static rendezvous, NPROC workers each (default 1), THREADS threads a worker (default 1), a fresh
# free master port and a private checkpoint directory per run, no periodic checkpoint:
#   gorun --nnodes=2 --node-rank=0|1 --nproc-per-node=NPROC --rdzv-backend=static \
#     --master-addr=127.0.0.1 --master-port=PORT TOML --threads THREADS --set parallel.mode=MODE \
#     --set checkpoint.every=0 --set checkpoint.memory=false|true --set checkpoint.memory_every=EVERY ...
# With memory = true every rank, after every EVERY-th step, copies its shard (parameters, AdamW m and v)
# and sends it in the background to its buddy rank on the other node (trainer/memcopy); the next
# snapshot waits for that transfer, so a transfer slower than a step shows up in the step time.
# For each parallel mode of MODES (default "fsdp hsdp") the two settings alternate REPS times (order
# swapped every repetition). Each run trains STEPS steps; the first SKIP are left out. A run's time per
# step is the median, over the blocks of EVERY timed steps (one copy each), of a block's time per step
# (rank 0's metrics.jsonl, whole job: the copy's hook runs between two records). The table has, per mode
# and setting, the median over the runs of that time and its tokens/s; the median of the ratios of
# adjacent pairs' times true/false (robust to a shared machine's drifting load; the spread column,
# min..max of those ratios, says how much is noise); the bytes each rank sends per copy (3 x 4 bytes x
# its shard: the parameters of the trainer's first line over its shards, padded) and the rate per rank
# that makes at the measured step time.
#
#   bench/memcopy.sh                           # MODES="fsdp hsdp" REPS=5 STEPS=100 SKIP=10 NPROC=1
#   REPS=5 EVERY=5 bench/memcopy.sh            # a copy every 5 steps
#   SET="model.layers=4 model.d_model=128" bench/memcopy.sh   # more --set overrides, a bigger model
#   GORUN_BIN=/path/to/gorun TOML=my.toml bench/memcopy.sh
#   SMOKE=1 bench/memcopy.sh                   # CI: fsdp, one pair of runs of 6 steps; fails when a
#                                              # column is not a number
set -euo pipefail

if [[ "${SMOKE:-0}" == 1 ]]; then
  : "${MODES:=fsdp}" "${REPS:=1}" "${STEPS:=6}" "${SKIP:=2}" "${SET:=optim.warmup=1}"
fi

MODES=${MODES:-fsdp hsdp}
REPS=${REPS:-5}
STEPS=${STEPS:-100}
SKIP=${SKIP:-10}
NPROC=${NPROC:-1}
THREADS=${THREADS:-1}
EVERY=${EVERY:-1}
SET=${SET:-}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
TOML=${TOML:-$root/examples/train.toml}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-memcopybench.XXXXXX")

# Agents of the run in progress: stopped (SIGTERM stops their workers) and waited for on any exit.
agents=()
cleanup() {
  local p
  for p in "${agents[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${agents[@]}"; do wait "$p" 2>/dev/null || true; done
  agents=()
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "memcopy.sh: $*" >&2; exit 1; }
for v in REPS STEPS NPROC THREADS EVERY; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"; done
[[ "$SKIP" =~ ^[0-9]+$ ]] && (( SKIP < STEPS )) || die "SKIP must be an integer below STEPS, got '$SKIP'"
(( STEPS - SKIP >= EVERY )) || die "STEPS - SKIP ($((STEPS - SKIP))) must hold at least one block of EVERY ($EVERY) steps"
for m in $MODES; do [[ $m == fsdp || $m == hsdp ]] || die "bad mode '$m': want fsdp or hsdp"; done
[[ -f $TOML ]] || die "TOML: no file $TOML"
TOML=$(cd "$(dirname "$TOML")" && pwd)/$(basename "$TOML")
sets=()
for s in $SET; do [[ $s == *=* ]] || die "SET: want section.key=value, got '$s'"; sets+=(--set "$s"); done

if [[ -n "${GORUN_BIN:-}" ]]; then
  gorun=$GORUN_BIN
else
  gorun=$tmp/gorun
  (cd "$root" && go build -o "$tmp/" ./cmd/gorun ./cmd/gorun-worker) || die "go build ./cmd/gorun ./cmd/gorun-worker failed"
fi
unset GORUN_BIN # gorun warns about GORUN_ variables it does not know
# One secret for every run: the workers authenticate each other, as in a real job.
GORUN_JOB_SECRET=$("$gorun" job-secret)
export GORUN_JOB_SECRET

# free_port prints a loopback TCP port nothing listens on now.
free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    return
  fi
  local p
  while :; do
    p=$(( 20000 + RANDOM % 40000 ))
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
}

# run MODE MEMORY: one two-node job; appends its tokens/s and ms per step over steps SKIP+1..STEPS to
# $tmp/tok.MODE.MEMORY and $tmp/ms.MODE.MEMORY, and keeps rank 0's first trainer line in $tmp/head.MODE.
run() {
  local mode=$1 memory=$2 port node rc=0
  # Fresh every time: a checkpoint would make the next run resume at its last step.
  rm -rf "$tmp/ckpt" "$tmp/m.jsonl" "$tmp"/log.*
  port=$(free_port)
  for node in 0 1; do
    "$gorun" --nnodes=2 --node-rank="$node" --nproc-per-node="$NPROC" --rdzv-backend=static \
      --master-addr=127.0.0.1 --master-port="$port" --log-format=console "$TOML" --threads "$THREADS" \
      --set parallel.mode="$mode" --set train.steps="$STEPS" --set train.log_every=1000000 \
      --set train.metrics="$tmp/m.jsonl" --set checkpoint.dir="$tmp/ckpt" --set checkpoint.every=0 \
      --set checkpoint.memory="$memory" --set checkpoint.memory_every="$EVERY" "${sets[@]}" \
      >"$tmp/log.$node" 2>&1 &
    agents+=($!)
  done
  for node in 0 1; do wait "${agents[node]}" || rc=$?; done
  agents=()
  if (( rc != 0 )); then
    for node in 0 1; do echo "--- node $node:"; tail -n 15 "$tmp/log.$node"; done >&2
    die "gorun $mode memory=$memory failed (exit $rc)"
  fi
  grep -m1 'trainer: [0-9]* parameters' "$tmp/log.0" >"$tmp/head.$mode" || die "no trainer line in node 0's log"
  awk -v skip="$SKIP" -v steps="$STEPS" -v every="$EVERY" -v tps="$(tokens_per_step)" \
    -v ms="$tmp/ms.$mode.$memory" -v tok="$tmp/tok.$mode.$memory" '
    { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /"elapsed_s":[0-9.e+-]+/); e[s] = substr($0, RSTART + 12, RLENGTH - 12) + 0 }
    END {
      if (!(steps in e) || (skip > 0 && !(skip in e)) || tps <= 0) exit 1
      # The median over blocks of EVERY steps (one copy each) of the time per step: robust to
      # another process taking the CPU for a while, and each block pays for its copy.
      n = 0
      for (s = skip; s + every <= steps; s += every) d[++n] = (e[s + every] - e[s]) / every
      for (i = 2; i <= n; i++) for (j = i; j > 1 && d[j - 1] > d[j]; j--) { x = d[j]; d[j] = d[j - 1]; d[j - 1] = x }
      dt = (n % 2) ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2
      printf "%.3f\n", 1000 * dt >>ms
      printf "%.1f\n", tps / dt >>tok
    }' "$tmp/m.jsonl" || die "no steps $SKIP and $STEPS in $tmp/m.jsonl, or no batch in node 0's trainer line"
}

# tokens_per_step prints global_batch x context of the run in progress's model (its trainer line).
tokens_per_step() {
  sed -n 's/.*context \([0-9]*\)).*global batch \([0-9]*\) =.*/\1 \2/p' "$tmp/log.0" | head -1 | awk '{ print $1 * $2 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "memcopy: $(basename "$TOML")${SET:+ + $SET}; 2 nodes x $NPROC workers x $THREADS threads on loopback; copy every $EVERY step(s)"
echo "  steps $((SKIP + 1))..$STEPS timed, $REPS reps interleaved, medians; $(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  gorun $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')"
echo

settings=(false true)
for mode in $MODES; do
  for (( i = 0; i < REPS; i++ )); do
    if (( i % 2 )); then order=(true false); else order=(false true); fi
    for memory in "${order[@]}"; do run "$mode" "$memory"; done
  done
done

printf '%-5s %-6s | %9s %9s | %9s %12s | %12s %10s\n' mode memory "tok/s" "ms/step" "true/false" "ratio spread" "bytes/copy" "MB/s"
for mode in $MODES; do
  # "N parameters ...; world W = R replicas x S shards": a rank's shard is ceil(N / S) elements.
  read -r params shards <<<"$(sed -n 's/.*trainer: \([0-9]*\) parameters.*x \([0-9]*\) shards.*/\1 \2/p' "$tmp/head.$mode")"
  [[ -n ${shards:-} ]] || die "cannot read the parameters and shards from: $(cat "$tmp/head.$mode")"
  bytes=$(( 12 * ((params + shards - 1) / shards) ))
  for memory in "${settings[@]}"; do
    tok=$(median <"$tmp/tok.$mode.$memory"); ms=$(median <"$tmp/ms.$mode.$memory")
    for v in tok ms; do [[ "${!v}" =~ ^[0-9]+\.?[0-9]*$ ]] || die "$mode memory=$memory: $v is '${!v}', not a number"; done
    if [[ $memory == true ]]; then
      ratios=$(paste "$tmp/ms.$mode.true" "$tmp/ms.$mode.false" | awk '{ print $1 / $2 }')
      ratio=$(median <<<"$ratios" | awk '{ printf "%.3fx", $1 }')
      spread=$(sort -g <<<"$ratios" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.3f..%.3f", lo, hi }')
      rate=$(awk -v b="$bytes" -v ms="$ms" -v e="$EVERY" 'BEGIN { printf "%.1f", b / e / (ms / 1000) / 1e6 }')
      for v in ratio rate; do [[ "${!v}" =~ ^[0-9]+\.?[0-9]*x?$ ]] || die "$mode: $v is '${!v}', not a number"; done
      printf '%-5s %-6s | %9.0f %9.2f | %9s %12s | %12s %10s\n' "$mode" "$memory" "$tok" "$ms" "$ratio" "$spread" "$bytes" "$rate"
    else
      printf '%-5s %-6s | %9.0f %9.2f | %9s %12s | %12s %10s\n' "$mode" "$memory" "$tok" "$ms" "" "" "" ""
    fi
  done
done
echo
echo "bytes/copy: what each rank sends per copy (parameters, AdamW m and v of its shard, float32);"
echo "MB/s: that per rank at the memory=true step time, over copies every $EVERY step(s)."
