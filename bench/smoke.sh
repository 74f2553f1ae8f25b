#!/usr/bin/env bash
# bench/smoke.sh — every bench script in its smoke mode (SMOKE=1: tiny sizes, one repetition), one
# after another, with one build of gorun; prints how long each took. scripts/test.sh runs it after
# the go tests, so that a bench which can no longer measure what it says (a memory row that found
# no worker, a launch that started nothing, a fault that was not injected, a ratio that is not a
# number) fails CI. A timing goal never does: smoke sizes say nothing about it.
#
#   bench/smoke.sh                       # every script
#   bench/smoke.sh launch memory         # some (names without .sh)
#   GORUN_BIN=/path/to/gorun bench/smoke.sh
#
# Each script's output goes to a log; a failing script's last lines are shown, and the loop goes
# on, so that one run names every broken bench. Exit status 1 if any failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-smoke.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Every script of bench/ but the loop's own helpers, so that a new bench cannot be left out; one
# without a smoke mode fails the loop rather than run at full size (chaos included: its smoke run
# is SMOKE=1 bench/chaos.sh).
all=()
for f in "$here"/*.sh; do
  n=$(basename "$f" .sh)
  case $n in lib | smoke | report) continue ;; esac
  all+=("$n")
done
names=("$@")
((${#names[@]})) || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ -f "$here/$n.sh" ]] || { echo "smoke.sh: no bench/$n.sh (want some of: ${all[*]})" >&2; exit 2; }
done

if [[ -n "${GORUN_BIN:-}" ]]; then
  [[ -x "$GORUN_BIN" ]] || { echo "smoke.sh: GORUN_BIN=$GORUN_BIN is not an executable" >&2; exit 2; }
else
  (cd "$root" && go build -o "$tmp/bin/" ./cmd/gorun ./cmd/gorun-worker) || { echo "smoke.sh: go build failed" >&2; exit 1; }
  GORUN_BIN=$tmp/bin/gorun
fi

failed=()
printf '%-12s %8s  %s\n' bench seconds result
for n in "${names[@]}"; do
  if ! grep -q 'SMOKE' "$here/$n.sh"; then
    printf '%-12s %8s  FAILED: bench/%s.sh has no smoke mode (SMOKE=1)\n' "$n" - "$n"
    failed+=("$n")
    continue
  fi
  t0=${EPOCHREALTIME/[.,]/}
  rc=0
  SMOKE=1 GORUN_BIN=$GORUN_BIN bash "$here/$n.sh" >"$tmp/$n.log" 2>&1 </dev/null || rc=$?
  t1=${EPOCHREALTIME/[.,]/}
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e6 }')
  if ((rc == 0)); then
    printf '%-12s %8s  ok\n' "$n" "$secs"
  else
    printf '%-12s %8s  FAILED (exit %d); its last lines:\n' "$n" "$secs" "$rc"
    tail -n 25 "$tmp/$n.log" | sed 's/^/    /'
    failed+=("$n")
  fi
done
if ((${#failed[@]})); then
  echo "smoke.sh: failed: ${failed[*]} (run one alone: SMOKE=1 bench/<name>.sh)" >&2
  exit 1
fi
