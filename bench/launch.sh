#!/usr/bin/env bash
# bench/launch.sh — launch overhead of gorun vs torchrun, side by side in one run.
#
# Times "start N workers, let them finish, exit" for both launchers, interleaved
# (the order alternates every round so neither always runs on a warm cache), and
# prints median / min / max wall time and the ratio gorun/torchrun; and the time
# from a worker's crash to its restarted worker.
#
#   bench/launch.sh                   # RUNS=10, 4 workers
#   RUNS=20 NPROC=8 bench/launch.sh
#   GORUN_BIN=/path/to/gorun bench/launch.sh   # skip the go build
#
# Rows:
#   noop     workers are /bin/true          (pure launcher overhead)
#   python   workers are python3 -c pass    (adds interpreter start-up, same for both)
#   restart  crash -> restarted worker: --standalone, one worker, --max-restarts=1;
#            attempt 0 (TORCHELASTIC_RESTART_COUNT=0) appends `date +%s.%N` to a file
#            right before it exits 1, attempt 1 appends it first thing; the time is
#            the second stamp minus the first. torchrun runs twice: with
#            --monitor_interval=0.1 (the fair setting, used by every row and the
#            ratio) and with its default 5 s (torchrun-5s). Goal: <= RESTART_GOAL
#            (0.1) x torchrun; printed, not part of the exit status.
#
# torchrun is Debian's torch 1.13 on Python 3.11: only underscore flags, and it
# needs --redirects 9:1 --tee 9:1 to start at all (see shared/lab/torchrun.sh).
# Goal: gorun median <= 0.05 x torchrun median. Exit status 1 when the noop row
# misses it (GOAL=... to change), so CI can run it as a check.
#
# SMOKE=1 (CI): RUNS=1, rows noop and restart, no torchrun-5s; then each launcher runs NPROC
# workers that each append their RANK to a file, and the run fails unless every rank 0..NPROC-1
# wrote exactly once (a launch that started nothing times nothing) or a ratio is not a number. Its
# exit status never depends on the goals.
set -euo pipefail

SMOKE=${SMOKE:-0}
if [[ "$SMOKE" == 1 ]]; then
  : "${RUNS:=1}" "${ROWS:=noop restart}"
fi
RUNS=${RUNS:-10}
NPROC=${NPROC:-4}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
GOAL=${GOAL:-0.05}
RESTART_GOAL=${RESTART_GOAL:-0.1}
ROWS=${ROWS:-noop python restart}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# What the launchers leave in TMPDIR (torchrun's torchelastic_* log dirs) goes with $tmp.
export TMPDIR=$tmp

die() { echo "launch.sh: $*" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, got '$RUNS'"
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || die "NPROC must be a positive integer, got '$NPROC'"

# --- the binaries -------------------------------------------------------------
if [[ -n "${GORUN_BIN:-}" ]]; then
  gorun=$GORUN_BIN
else
  gorun=$tmp/gorun
  (cd "$root" && go build -o "$tmp/" ./cmd/gorun ./cmd/gorun-worker) || die "go build ./cmd/gorun ./cmd/gorun-worker failed"
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

# The restart row's worker: attempt 0 stamps and exits 1, attempt 1 stamps and exits 0.
stamps=$tmp/restart.stamps
cat >"$tmp/restart-worker.sh" <<'WORKER'
#!/bin/sh
if [ "${TORCHELASTIC_RESTART_COUNT:-}" = 0 ]; then
  echo "exit $(date +%s.%N)" >>"$1"
  exit 1
fi
echo "start $(date +%s.%N)" >>"$1"
WORKER
restart_worker="/bin/sh $tmp/restart-worker.sh $stamps"

gorun_cmd() {
  case $1 in
    noop)    echo "$gorun --standalone --nproc-per-node=$NPROC --no-python /bin/true" ;;
    python)  echo "$gorun --standalone --nproc-per-node=$NPROC --no-python $TORCH_PYTHON -c pass" ;;
    restart) echo "$gorun --standalone --nproc-per-node=1 --max-restarts=1 --no-python $restart_worker" ;;
  esac
}
# torchrun_cmd ROW [MONITOR_INTERVAL]: the torchrun command of ROW; the monitor
# interval is 0.1 s unless given ("" for torchrun's default).
torchrun_cmd() {
  local monitor=--monitor_interval=${2-0.1}
  [[ $monitor == --monitor_interval= ]] && monitor=
  local base="$TORCH_PYTHON -m torch.distributed.run --standalone $monitor --redirects 9:1 --tee 9:1 --no_python"
  case $1 in
    noop)    echo "$base --nproc_per_node=$NPROC /bin/true" ;;
    python)  echo "$base --nproc_per_node=$NPROC $TORCH_PYTHON -c pass" ;;
    restart) echo "$base --nproc_per_node=1 --max_restarts=1 $restart_worker" ;;
  esac
}

# restart_one LOG CMD... : runs CMD (a launch of the restart worker) and prints
# the µs from attempt 0's exit stamp to attempt 1's start stamp; fails (and
# shows the log) if CMD fails or the stamps are not one exit then one start.
restart_one() {
  local log=$1; shift
  : >"$stamps"
  time_one "$log" "$@" >/dev/null || return 1
  awk '$1 == "exit" { e = $2; ne++ } $1 == "start" { s = $2; ns++ }
    END { if (ne != 1 || ns != 1) exit 1; printf "%d\n", (s - e) * 1e6 }' "$stamps" || {
    { echo "launch.sh: want one exit stamp then one start stamp from: $*"; cat "$stamps"; tail -n 20 "$log"; } >&2
    return 1
  }
}

# launchers ROW: the launcher columns of ROW.
launchers() {
  local l=gorun
  (( have_torch )) && l+=" torchrun"
  (( have_torch )) && [[ $1 == restart && $SMOKE != 1 ]] && l+=" torchrun-5s"
  echo "$l"
}

# --- run ----------------------------------------------------------------------
echo "launch overhead: $NPROC workers (restart row: 1), $RUNS runs each, interleaved ($(nproc) CPUs, $(uname -r))"
echo "gorun:    $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?') $gorun"
if (( have_torch )); then
  echo "torchrun: torch $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)'), $("$TORCH_PYTHON" --version 2>&1)"
fi
echo

# cmd_of ROW LAUNCHER: the command line.
cmd_of() {
  case $2 in
    gorun)       gorun_cmd "$1" ;;
    torchrun)    torchrun_cmd "$1" ;;
    torchrun-5s) torchrun_cmd "$1" "" ;;
  esac
}

# measure ROW LAUNCHER: one sample in µs (wall time, or crash to restart).
measure() {
  local cmd
  read -r -a cmd <<<"$(cmd_of "$1" "$2")"
  if [[ $1 == restart ]]; then
    restart_one "$tmp/log" "${cmd[@]}"
  else
    time_one "$tmp/log" "${cmd[@]}"
  fi
}

for row in $ROWS; do
  read -r -a who <<<"$(launchers "$row")"
  for w in "${who[@]}"; do
    : >"$tmp/$row.$w"
    # One untimed warm-up each (page cache, Python bytecode).
    measure "$row" "$w" >/dev/null || die "$w failed ($row)"
  done
  for (( i = 0; i < RUNS; i++ )); do
    # Rotate the order every run, so no launcher always runs first.
    for (( k = 0; k < ${#who[@]}; k++ )); do
      w=${who[(i + k) % ${#who[@]}]}
      measure "$row" "$w" >>"$tmp/$row.$w" || die "$w failed ($row, run $i)"
    done
  done
done

printf '%-8s %-11s %10s %10s %10s\n' row launcher "median ms" "min ms" "max ms"
verdict=0
for row in $ROWS; do
  read -r -a who <<<"$(launchers "$row")"
  declare -A median=()
  for w in "${who[@]}"; do
    read -r m mmin mmax <<<"$(stats "$tmp/$row.$w")"
    median[$w]=$m
    printf '%-8s %-11s %10s %10s %10s\n' "$row" "$w" "$m" "$mmin" "$mmax"
  done
  goal=$GOAL; [[ $row == restart ]] && goal=$RESTART_GOAL
  for w in "${who[@]:1}"; do
    ratio=$(awk -v a="${median[gorun]}" -v b="${median[$w]}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "nan" }')
    [[ "$ratio" =~ ^[0-9]+\.[0-9]+$ ]] || die "$row: gorun/$w is '$ratio', not a number"
    if [[ $w == torchrun ]]; then
      ok=$(awk -v r="$ratio" -v g="$goal" 'BEGIN { print (r <= g) ? "meets" : "MISSES" }')
      printf '%-8s %-11s %10s   gorun/%s (median); goal <= %s: %s\n' "$row" ratio "${ratio}x" "$w" "$goal" "$ok"
      [[ $row == noop && $ok == MISSES ]] && verdict=1
    else
      printf '%-8s %-11s %10s   gorun/%s (median)\n' "$row" ratio "${ratio}x" "$w"
    fi
  done
  unset median
done

# The smoke run's check that each launcher started its workers: NPROC workers append their RANK.
if [[ "$SMOKE" == 1 ]]; then
  printf '#!/bin/sh\necho "$RANK" >>"$1"\n' >"$tmp/mark-worker.sh"
  marks=$tmp/marks
  for w in gorun $( (( have_torch )) && echo torchrun); do
    : >"$marks"
    if [[ $w == gorun ]]; then
      cmd=("$gorun" --standalone --nproc-per-node="$NPROC" --no-python /bin/sh "$tmp/mark-worker.sh" "$marks")
    else
      cmd=("$TORCH_PYTHON" -m torch.distributed.run --standalone --redirects 9:1 --tee 9:1 --no_python
        --nproc_per_node="$NPROC" /bin/sh "$tmp/mark-worker.sh" "$marks")
    fi
    time_one "$tmp/log" "${cmd[@]}" >/dev/null || die "$w failed to run $NPROC marking workers"
    got=$(sort -n "$marks" | tr '\n' ' ')
    want=$(seq 0 $((NPROC - 1)) | tr '\n' ' ')
    [[ "$got" == "$want" ]] || die "$w --nproc-per-node=$NPROC started workers of ranks '$got', want '$want'"
    echo "smoke: $w started ranks $got"
  done
  exit 0
fi

echo
echo "goal: gorun <= ${GOAL}x torchrun (noop row decides the exit status; python row shows the share of"
echo "interpreter start-up); restart: crash -> restarted worker <= ${RESTART_GOAL}x torchrun at --monitor_interval=0.1"
exit "$verdict"
