#!/usr/bin/env bash
# bench/launch.sh — launch overhead of gorun vs torchrun, side by side in one run.
#
# Times "start N workers, let them finish, exit" for both launchers, interleaved
# (the order alternates every round so neither always runs on a warm cache), and
# prints median / min / max wall time and the ratio gorun/torchrun.
#
#   bench/launch.sh                   # RUNS=10, 4 workers
#   RUNS=20 NPROC=8 bench/launch.sh
#   GORUN_BIN=/path/to/gorun bench/launch.sh   # skip the go build
#
# Rows:
#   noop     workers are /bin/true          (pure launcher overhead)
#   python   workers are python3 -c pass    (adds interpreter start-up, same for both)
#
# torchrun is Debian's torch 1.13 on Python 3.11: only underscore flags, and it
# needs --redirects 9:1 --tee 9:1 to start at all (see shared/lab/torchrun.sh).
# Goal: gorun median <= 0.05 x torchrun median. Exit status 1 when the noop row
# misses it (GOAL=... to change), so CI can run it as a check.
set -euo pipefail

RUNS=${RUNS:-10}
NPROC=${NPROC:-4}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
GOAL=${GOAL:-0.05}
ROWS=${ROWS:-noop python}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

die() { echo "launch.sh: $*" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, got '$RUNS'"
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || die "NPROC must be a positive integer, got '$NPROC'"

# --- the binaries -------------------------------------------------------------
if [[ -n "${GORUN_BIN:-}" ]]; then
  gorun=$GORUN_BIN
else
  gorun=$tmp/gorun
  (cd "$root" && go build -o "$gorun" ./cmd/gorun) || die "go build ./cmd/gorun failed"
fi
have_torch=1
if ! "$TORCH_PYTHON" -c 'import torch.distributed.run' 2>/dev/null; then
  have_torch=0
  echo "launch.sh: $TORCH_PYTHON cannot import torch: torchrun column skipped" >&2
fi

# --- timing -------------------------------------------------------------------
# Microseconds since the epoch. Bash 5's EPOCHREALTIME needs no fork; fall
# back to date(1) elsewhere.
now_us() {
  if [[ -n "${EPOCHREALTIME:-}" ]]; then
    local t=${EPOCHREALTIME/[.,]/}
    echo "$t"
  else
    echo $(( $(date +%s%N) / 1000 ))
  fi
}

# time_one LOG CMD... : runs CMD with output to LOG, prints elapsed µs; fails
# (and shows the log) if CMD fails.
time_one() {
  local log=$1; shift
  local t0 t1 rc=0
  t0=$(now_us)
  "$@" >"$log" 2>&1 || rc=$?
  t1=$(now_us)
  if (( rc != 0 )); then
    { echo "launch.sh: exit $rc from: $*"; tail -n 20 "$log"; } >&2
    return 1
  fi
  echo $(( t1 - t0 ))
}

# stats FILE : "median min max" in ms of the µs samples in FILE.
stats() {
  sort -n "$1" | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan nan nan"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.1f %.1f %.1f\n", m / 1000, v[1] / 1000, v[NR] / 1000 }'
}

gorun_cmd() {
  case $1 in
    noop)   echo "$gorun --standalone --nproc-per-node=$NPROC --no-python /bin/true" ;;
    python) echo "$gorun --standalone --nproc-per-node=$NPROC --no-python $TORCH_PYTHON -c pass" ;;
  esac
}
torchrun_cmd() {
  local base="$TORCH_PYTHON -m torch.distributed.run --standalone --nproc_per_node=$NPROC --monitor_interval=0.1 --redirects 9:1 --tee 9:1 --no_python"
  case $1 in
    noop)   echo "$base /bin/true" ;;
    python) echo "$base $TORCH_PYTHON -c pass" ;;
  esac
}

# --- run ----------------------------------------------------------------------
echo "launch overhead: $NPROC workers, $RUNS runs each, interleaved ($(nproc) CPUs, $(uname -r))"
echo "gorun:    $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?') $gorun"
if (( have_torch )); then
  echo "torchrun: torch $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)'), $("$TORCH_PYTHON" --version 2>&1)"
fi
echo

for row in $ROWS; do
  read -r -a g <<<"$(gorun_cmd "$row")"
  read -r -a tr <<<"$(torchrun_cmd "$row")"
  : >"$tmp/$row.gorun"; : >"$tmp/$row.torchrun"
  # One untimed warm-up each (page cache, Python bytecode).
  time_one "$tmp/log" "${g[@]}" >/dev/null || die "gorun failed ($row)"
  if (( have_torch )); then time_one "$tmp/log" "${tr[@]}" >/dev/null || die "torchrun failed ($row)"; fi
  for (( i = 0; i < RUNS; i++ )); do
    order="gorun torchrun"; (( i % 2 )) && order="torchrun gorun"
    for who in $order; do
      if [[ $who == gorun ]]; then
        time_one "$tmp/log" "${g[@]}" >>"$tmp/$row.gorun" || die "gorun failed ($row, run $i)"
      elif (( have_torch )); then
        time_one "$tmp/log" "${tr[@]}" >>"$tmp/$row.torchrun" || die "torchrun failed ($row, run $i)"
      fi
    done
  done
done

printf '%-8s %-9s %10s %10s %10s\n' row launcher "median ms" "min ms" "max ms"
verdict=0
for row in $ROWS; do
  read -r gm gmin gmax <<<"$(stats "$tmp/$row.gorun")"
  printf '%-8s %-9s %10s %10s %10s\n' "$row" gorun "$gm" "$gmin" "$gmax"
  if (( have_torch )); then
    read -r tm tmin tmax <<<"$(stats "$tmp/$row.torchrun")"
    printf '%-8s %-9s %10s %10s %10s\n' "$row" torchrun "$tm" "$tmin" "$tmax"
    ratio=$(awk -v a="$gm" -v b="$tm" 'BEGIN { printf "%.3f", a / b }')
    ok=$(awk -v r="$ratio" -v g="$GOAL" 'BEGIN { print (r <= g) ? "meets" : "MISSES" }')
    printf '%-8s %-9s %10s   gorun/torchrun (median); goal <= %s: %s\n' "$row" ratio "${ratio}x" "$GOAL" "$ok"
    [[ $row == noop && $ok == MISSES ]] && verdict=1
  fi
done
echo
echo "goal: gorun <= ${GOAL}x torchrun (noop row decides; python row shows the share of interpreter start-up)"
exit "$verdict"
