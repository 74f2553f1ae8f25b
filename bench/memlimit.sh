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
set -euo pipefail

MODES=${MODES:-ddp fsdp} WORKERS=${WORKERS:-4} LIMIT=${LIMIT:-600000000} STEPS=${STEPS:-4}
LAYERS=8 DMODEL=512 HEADS=8 CONTEXT=64 GLOBAL=16 MICRO=2 # issue 22's model
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init memlimit.sh
bench_positive WORKERS LIMIT STEPS
bench_modes $MODES
command -v prlimit >/dev/null || die "prlimit (util-linux) not found"
bench_gorun

echo "issue 22's model (25.4M parameters), $WORKERS workers, each limited to $LIMIT bytes of data (prlimit --data)"
echo "  gorun $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo '?'); $(nproc) CPUs"
echo
echo "| mode | estimate per worker | result |"
echo "|---|---|---|"
for mode in $MODES; do
  dir=$tmp/$mode
  bench_toml "$dir" "$mode" "" 1
  est=$("$gorun" estimate "$dir/train.toml" --nproc-per-node "$WORKERS" --json |
    grep -F '"selected":true' | sed -n 's/.*"total_bytes":\([0-9]*\).*/\1/p')
  rc=0
  (cd "$dir" && exec "$gorun" --standalone --nproc-per-node="$WORKERS" --no-python \
    prlimit --data="$LIMIT": "$gorun" worker train.toml) >"$dir/log" 2>&1 &
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
done
