#!/usr/bin/env bash
# bench/memlimit.sh — does a model train under a per-process memory limit, mode by mode (issue 22)?
#
# For each MODE of MODES it runs issue 22's model (8 layers, d_model 512, 8 heads, context 64: 25.4M
# parameters; 4 steps of a global batch of 16 in micro batches of 2) on WORKERS processes, each worker
# under a limit of LIMIT bytes of private writable memory:
#   gorun --standalone --nproc-per-node=WORKERS --no-python prlimit --data=LIMIT: gorun worker train.toml
# RLIMIT_DATA counts private writable mappings (Linux >= 4.7), which is where the Go heap lives; the
# collectives' shared-memory slots are shared mappings and do not count. A worker that needs more
# dies with "fatal error: runtime: out of memory". It prints, per mode, whether the run trained to
# the end (exit 0 and rank 0's "step STEPS/STEPS" line) or what stopped it.
#
#   bench/memlimit.sh                                 # MODES="ddp fsdp" WORKERS=4 LIMIT=600000000
#   LIMIT=400000000 MODES="zero1 zero2 fsdp" bench/memlimit.sh
#   GORUN_BIN=/path/to/gorun bench/memlimit.sh        # a built binary (default: go build ./cmd/gorun)
#   SMOKE=1 bench/memlimit.sh                         # CI: a tiny model, fsdp on 2 workers, once under
#                                                     # LIMIT (must train) and once under SMOKE_LOW
#                                                     # (must not): the limit is applied
set -euo pipefail

if [[ "${SMOKE:-0}" == 1 ]]; then
  : "${MODES:=fsdp}" "${WORKERS:=2}" "${LAYERS:=2}" "${DMODEL:=64}" "${HEADS:=4}" "${CONTEXT:=16}" "${GLOBAL:=4}"
fi
MODES=${MODES:-ddp fsdp} WORKERS=${WORKERS:-4} LIMIT=${LIMIT:-600000000} STEPS=${STEPS:-4}
# issue 22's model unless given
LAYERS=${LAYERS:-8} DMODEL=${DMODEL:-512} HEADS=${HEADS:-8} CONTEXT=${CONTEXT:-64} GLOBAL=${GLOBAL:-16} MICRO=${MICRO:-2}
# SMOKE_LOW: the limit of the smoke run's second row, far below what a worker needs.
SMOKE_LOW=${SMOKE_LOW:-20000000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init memlimit.sh
bench_positive WORKERS LIMIT STEPS LAYERS DMODEL HEADS CONTEXT GLOBAL MICRO SMOKE_LOW
bench_modes $MODES
command -v prlimit >/dev/null || die "prlimit (util-linux) not found"
bench_gorun

echo "$LAYERS layers, d_model $DMODEL, $HEADS heads, context $CONTEXT, $WORKERS workers, each limited to $LIMIT bytes of data (prlimit --data)"
echo "  gorun $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo '?'); $(nproc) CPUs"
echo
echo "| mode | estimate per worker | result |"
echo "|---|---|---|"
# row MODE LIMIT: one run of MODE with every worker under LIMIT bytes of data; prints its table row
# and leaves the result in $result.
row() {
  local mode=$1 limit=$2 dir=$tmp/$1-$2 est rc=0
  bench_toml "$dir" "$mode" "" 1
  est=$("$gorun" estimate "$dir/train.toml" --nproc-per-node "$WORKERS" --json) || die "gorun estimate $dir/train.toml failed"
  est=$(grep -F '"selected":true' <<<"$est" | sed -n 's/.*"total_bytes":\([0-9]*\).*/\1/p')
  bench_number "$mode: estimate's total_bytes" "$est"
  (cd "$dir" && exec "$gorun" --standalone --nproc-per-node="$WORKERS" --no-python \
    prlimit --data="$limit": "$gorun" worker train.toml) >"$dir/log" 2>&1 &
  agent=$!
  wait "$agent" || rc=$?
  agent=
  if [[ $rc == 0 ]] && grep -q "step $STEPS/$STEPS" "$dir/log"; then
    result="trained to step $STEPS"
  elif grep -q 'runtime: out of memory' "$dir/log"; then
    result="out of memory (exit $rc)"
  else
    result="failed (exit $rc): $(grep -m1 -iE 'error|fatal' "$dir/log" | cut -c1-120)"
  fi
  echo "| $mode | $((est / 1000000)) MB | $result |"
}

for mode in $MODES; do
  row "$mode" "$LIMIT"
  # The smoke run: a model this small trains under LIMIT, and cannot under SMOKE_LOW; anything else
  # means the limit no longer reaches the workers. (How a Go worker dies that far below its needs
  # varies: "out of memory allocating heap arena map", a failed pthread_create, SIGSEGV.)
  if [[ "$SMOKE" == 1 ]]; then
    [[ "$result" == trained* ]] || die "$mode under $LIMIT bytes: want trained, got: $result"
    row "$mode" "$SMOKE_LOW"
    [[ "$result" != trained* ]] || die "$mode under $SMOKE_LOW bytes trained: the limit did not reach the workers"
  fi
done
