#!/usr/bin/env bash
# bench/modes.sh — embedded-trainer tokens/s of each parallel.mode on WORKERS processes, side by side
# in one run (issue 22: what sharding the parameters costs in throughput).
#
# For each MODE of MODES it runs, on this machine,
#   gorun --standalone --nproc-per-node=WORKERS train.toml        (parallel.mode = MODE)
# for STEPS steps of the bench model (default: 4 layers, d_model 128, 4 heads, context 128, global
# batch 32 in micro batches of 8, so 2 workers take 2 micro batches each), each run in a fresh
# directory, and reads the whole-job tokens/s of every step after the first SKIP from rank 0's
# metrics file; a run's figure is their median. The modes alternate REPS times (the order rotated
# every repetition), and each mode's row is the median of its runs, with ratio = that over the first
# mode's. BASE=/path/to/another/gorun adds a row "base:MODE" per mode run by that binary in the same
# rotation (a build before a change, to compare side by side).
#
#   bench/modes.sh                                        # MODES="fsdp zero2 zero1 ddp" WORKERS=2 REPS=3
#   BASE=/tmp/gorun-before MODES=fsdp REPS=5 bench/modes.sh
#   LAYERS=8 DMODEL=512 HEADS=8 CONTEXT=64 GLOBAL=16 MICRO=2 WORKERS=4 bench/modes.sh   # issue 22's model
#   GORUN_BIN=/path/to/gorun bench/modes.sh               # a built binary (default: go build ./cmd/gorun)
#   SMOKE=1 bench/modes.sh                                # CI: fsdp and ddp once each, a tiny model; fails
#                                                         # when a median or a ratio is not a number
set -euo pipefail

if [[ "${SMOKE:-0}" == 1 ]]; then
  : "${MODES:=fsdp ddp}" "${REPS:=1}" "${STEPS:=6}" "${SKIP:=2}" "${LAYERS:=2}" "${DMODEL:=64}" "${CONTEXT:=16}" "${GLOBAL:=8}" "${MICRO:=4}"
fi

MODES=${MODES:-fsdp zero2 zero1 ddp}
WORKERS=${WORKERS:-2} REPS=${REPS:-3} STEPS=${STEPS:-20} SKIP=${SKIP:-3}
LAYERS=${LAYERS:-4} DMODEL=${DMODEL:-128} HEADS=${HEADS:-4} CONTEXT=${CONTEXT:-128}
GLOBAL=${GLOBAL:-32} MICRO=${MICRO:-8}
PY=${PY:-/usr/bin/python3}

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init modes.sh
bench_positive WORKERS REPS STEPS LAYERS DMODEL HEADS CONTEXT GLOBAL MICRO
[[ "$SKIP" =~ ^[0-9]+$ && "$SKIP" -lt "$STEPS" ]] || die "SKIP must be an integer below STEPS ($STEPS), got '$SKIP'"
bench_modes $MODES
[[ -x "$PY" ]] || die "$PY not found (it reads the metrics files; PY=... to change)"
bench_gorun
[[ -z "${BASE:-}" || -x "$BASE" ]] || die "BASE=$BASE is not an executable"

# The rows: MODE runs this gorun, base:MODE runs BASE.
rows=()
for m in $MODES; do
  rows+=("$m")
  [[ -n "${BASE:-}" ]] && rows+=("base:$m")
done

# run ROW DIR: one run of ROW in DIR; prints its median tokens/s.
run() {
  local row=$1 dir=$2 bin=$gorun mode=$1
  if [[ "$row" == base:* ]]; then bin=$BASE mode=${row#base:}; fi
  bench_toml "$dir" "$mode" "$dir/metrics.jsonl" 1000 $'[checkpoint]\nevery = 0'
  (cd "$dir" && exec "$bin" --standalone --nproc-per-node="$WORKERS" train.toml) >"$dir/log" 2>&1 &
  agent=$!
  if ! wait "$agent"; then
    agent=
    tail -5 "$dir/log" >&2
    die "$row failed (log above)"
  fi
  agent=
  "$PY" - "$dir/metrics.jsonl" "$SKIP" <<'EOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(round(statistics.median(r["tokens_per_s"] for r in recs if r["step"] > int(sys.argv[2]))))
EOF
}

declare -A runs
n=${#rows[@]}
for rep in $(seq 0 $((REPS - 1))); do
  for i in $(seq 0 $((n - 1))); do
    row=${rows[$(((i + rep) % n))]}
    tps=$(run "$row" "$tmp/$rep-${row/:/-}")
    runs[$row]="${runs[$row]:-} $tps"
  done
done

echo "tokens/s per parallel.mode: $WORKERS workers, $LAYERS layers, d_model $DMODEL, $HEADS heads, context $CONTEXT,"
echo "  global batch $GLOBAL (micro $MICRO), $STEPS steps (median of steps after $SKIP), $REPS alternating runs each"
echo "  gorun $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo '?'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| mode | runs (tokens/s) | median | ratio to ${rows[0]} |"
echo "|---|---|---|---|"
first=
for row in "${rows[@]}"; do
  med=$(tr ' ' '\n' <<<"${runs[$row]}" | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  bench_number "$row: median tokens/s" "$med"
  [[ -z "$first" ]] && first=$med
  ratio=$(awk -v a="$med" -v b="$first" 'BEGIN { if (b > 0) printf "%.2fx", a/b; else print "nan" }')
  bench_number "$row: ratio to ${rows[0]}" "$ratio"
  echo "| $row |${runs[$row]} | $med | $ratio |"
done
