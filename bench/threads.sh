#!/usr/bin/env bash
# bench/threads.sh — one process per core beside one process using every core, in one interleaved run.
#
# Trains the bench model of issue 13 (4 layers, d_model 128, 4 heads, context 128, global batch 16;
# LAYERS, DMODEL, HEADS, CONTEXT, GLOBAL change it) on the corpus of examples/train.toml through the
# launcher, as a user would, in each layout of LAYOUTS (PROCSxTHREADS, default "1x2 2x1"):
#   gorun --nproc-per-node=PROCS bench.toml --threads THREADS --profile
# Each rank takes GLOBAL/PROCS sequences in one micro step (no accumulation), so every layout does
# the same work per optimizer step; the layout with several ranks shards the parameters over them
# (parallel.mode = hsdp, one node: fsdp) and pays the reduce-scatter and all-gather over loopback.
# Each run trains STEPS steps; the first SKIP are left out. The layouts alternate REPS times (order
# swapped every repetition). The table has the median tokens/s of each layout (whole job, rank 0's
# metrics), the median share of the step rank 0 spent in collectives (its --profile records), and
# the median of the ratios of adjacent pairs against the first layout, robust to a shared machine's
# drifting load; the spread column (min..max of those ratios) says how much of it is noise.
#
#   bench/threads.sh                          # LAYOUTS="1x2 2x1" REPS=5 STEPS=30 SKIP=5
#   LAYOUTS="1x2 2x1 1x1" REPS=7 bench/threads.sh
#   GORUN_BIN=/path/to/gorun bench/threads.sh
#   SMOKE=1 bench/threads.sh                  # CI: one rep of a tiny model; fails when a column is not
#                                             # a number (no metrics, no --profile records)
set -euo pipefail

if [[ "${SMOKE:-0}" == 1 ]]; then
  : "${REPS:=1}" "${STEPS:=6}" "${SKIP:=2}" "${LAYERS:=2}" "${DMODEL:=64}" "${CONTEXT:=16}" "${GLOBAL:=8}"
fi

LAYOUTS=${LAYOUTS:-1x2 2x1}
REPS=${REPS:-5}
STEPS=${STEPS:-30}
SKIP=${SKIP:-5}
LAYERS=${LAYERS:-4} DMODEL=${DMODEL:-128} HEADS=${HEADS:-4} CONTEXT=${CONTEXT:-128} GLOBAL=${GLOBAL:-16}

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_init threads.sh
bench_positive REPS STEPS LAYERS DMODEL HEADS CONTEXT GLOBAL
[[ "$SKIP" =~ ^[0-9]+$ ]] && (( SKIP < STEPS )) || die "SKIP must be an integer below STEPS, got '$SKIP'"
for l in $LAYOUTS; do
  [[ "$l" =~ ^([1-9][0-9]*)x([1-9][0-9]*)$ ]] || die "bad layout '$l': want PROCSxTHREADS, e.g. 2x1"
  (( GLOBAL % ${BASH_REMATCH[1]} == 0 )) || die "layout $l: $GLOBAL sequences do not split over ${BASH_REMATCH[1]} processes"
done

bench_gorun

goroot=$(cd "$root" && go env GOROOT)
cat "$goroot"/src/{fmt,strings,sort,bytes,bufio,errors}/*.go >"$tmp/corpus.txt"
cat >"$tmp/bench.toml" <<EOF
[model]
layers = $LAYERS
d_model = $DMODEL
heads = $HEADS
context = $CONTEXT

[data]
files = ["corpus.txt"]

[train]
steps = $STEPS
global_batch = $GLOBAL
micro_batch = $GLOBAL
log_every = 1000000
metrics = "m.jsonl"

[optim]
lr = 1e-2
min_lr = 1e-3
warmup = $(( STEPS < 20 ? STEPS : 20 ))
EOF

# run LAYOUT: appends tokens/s of steps SKIP+1..STEPS to $tmp/tok.LAYOUT and the collectives share
# of each timed step to $tmp/coll.LAYOUT.
run() {
  local procs=${1%x*} threads=${1#*x}
  # Fresh every time: a checkpoint would make the next run resume at its last step.
  rm -rf "$tmp/m.jsonl" "$tmp/ckpt"
  (cd "$tmp" && "$gorun" --nproc-per-node="$procs" bench.toml --threads "$threads" --profile \
    --set train.micro_batch=$(( GLOBAL / procs )) >"$tmp/log" 2>&1) || { tail -20 "$tmp/log" >&2; die "gorun $1 failed"; }
  awk -v skip="$SKIP" -v steps="$STEPS" -v tok=$(( GLOBAL * CONTEXT )) '
    { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /"elapsed_s":[0-9.e+-]+/); e[s] = substr($0, RSTART + 12, RLENGTH - 12) + 0 }
    END { printf "%.1f\n", (steps - skip) * tok / (e[steps] - e[skip]) }' "$tmp/m.jsonl" >>"$tmp/tok.$1"
  awk -v skip="$SKIP" '
    { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /"collectives_s":[0-9.e+-]+/); c = substr($0, RSTART + 16, RLENGTH - 16) + 0
      match($0, /"step_s":[0-9.e+-]+/); t = substr($0, RSTART + 9, RLENGTH - 9) + 0
      if (s > skip && t > 0) print c / t }' "$tmp/m.jsonl" >>"$tmp/coll.$1"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "threads: ${LAYERS} layers, d_model $DMODEL, $HEADS heads, context $CONTEXT, batch $GLOBAL;"
echo "  steps $((SKIP + 1))..$STEPS timed, $REPS reps interleaved, medians; $(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  gorun $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')"
echo

read -r -a layouts <<<"$LAYOUTS"
for (( i = 0; i < REPS; i++ )); do
  order=("${layouts[@]}")
  if (( i % 2 )); then
    for (( j = 0; j < ${#layouts[@]}; j++ )); do order[j]=${layouts[${#layouts[@]} - 1 - j]}; done
  fi
  for l in "${order[@]}"; do run "$l"; done
done

base=${layouts[0]}
printf '%-15s | %10s %12s | %12s %14s\n' "procs x threads" "tok/s" "collectives" "vs $base" "ratio spread"
for l in "${layouts[@]}"; do
  tok=$(median <"$tmp/tok.$l"); coll=$(median <"$tmp/coll.$l")
  ratios=$(paste "$tmp/tok.$l" "$tmp/tok.$base" | awk '{ print $1 / $2 }')
  ratio=$(median <<<"$ratios")
  spread=$(sort -g <<<"$ratios" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f..%.2f", lo, hi }')
  for v in tok coll ratio; do bench_number "$l: $v" "${!v}"; done
  printf '%-15s | %10.0f %11.1f%% | %11.2fx %14s\n' "$l" "$tok" "$(awk -v c="$coll" 'BEGIN { print 100 * c }')" "$ratio" "$spread"
done
