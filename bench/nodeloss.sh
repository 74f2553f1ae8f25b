#!/usr/bin/env bash
# bench/nodeloss.sh — node loss in place: seconds from the kill to the first step at the new world size,
# beside the goal (lease TTL + 1 s), and whether every survivor kept its worker processes.
#
# Runs test/e2e's TestNodeLossKeepsEveryWorker RUNS times (default 4): three gorun agents of two
# workers of the embedded trainer over one etcd (lease_ttl=2, hsdp, no periodic checkpoint), every
# worker paused at a step boundary, node-c's agent and workers killed -9 together (each order: agent
# first, workers first), the others continued. The test fails when a survivor's worker process was
# replaced; each run prints "kill ... to the first step at world size 4: S s; goal ... : Rx the goal".
# The script prints those lines, then per order the median and max of S and of the ratio R, and exits
# 1 when a run failed or printed no such line (the bench measured nothing). SMOKE=1 (bench/smoke.sh) is RUNS=1.
#
#   bench/nodeloss.sh              # RUNS=4
#   RUNS=1 bench/nodeloss.sh       # smoke
set -euo pipefail

RUNS=${RUNS:-4}
[[ "${SMOKE:-0}" == 1 ]] && RUNS=1
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "nodeloss.sh: RUNS=$RUNS: want a positive integer" >&2; exit 1; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log=$(mktemp "${TMPDIR:-/tmp}/gorun-nodeloss.XXXXXX")
trap 'rm -f "$log"' EXIT

cd "$root"
status=0
go test -count="$RUNS" -p 1 -timeout 30m -run 'TestNodeLossKeepsEveryWorker' -v ./test/e2e >"$log" 2>&1 || status=$?
lines=$(grep -o 'node loss in place (.*' "$log" || true)
echo "== node loss in place, $RUNS run(s) per order (lease TTL 2 s, goal TTL + 1 s = 3 s)"
echo "$lines"
if [[ -z "$lines" ]]; then
  tail -40 "$log" >&2
  echo "nodeloss.sh: no run printed its measurement" >&2
  exit 1
fi
echo
printf '   %-14s %5s %10s %10s %12s %12s\n' order runs "median s" "max s" "median x" "max x"
for order in "agent first" "workers first"; do
  grep -F "($order)" <<<"$lines" | sed -E 's/.*world size 4: ([0-9.]+) s;.*: ([0-9.]+)x the goal.*/\1 \2/' |
    sort -n | awk -v o="$order" '{s[NR]=$1; r[NR]=$2; if ($2>mr) mr=$2; if ($1>ms) ms=$1}
      END {if (NR) { m=int((NR+1)/2); printf "   %-14s %5d %10.2f %10.2f %12.2f %12.2f\n", o, NR, s[m], ms, r[m], mr }}'
done
if [[ $status -ne 0 ]]; then
  grep -E -- '--- FAIL|changed' "$log" >&2 || tail -40 "$log" >&2
  echo "nodeloss.sh: go test failed (exit $status)" >&2
  exit 1
fi
