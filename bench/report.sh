#!/usr/bin/env bash
# bench/report.sh — runs the benches in full and rewrites docs/benchmarks.md's generated sections.
#
# For each NAME (default: every section below), runs its command from bench/ and replaces the text
# between `<!-- report:NAME begin -->` and `<!-- report:NAME end -->` in DOC (default
# docs/benchmarks.md) with a stamp (commit, UTC date, nproc, CPU model, load average, the command)
# and the bench's output. A bench that exits 0 is written; one that exits non-zero is written only
# when its output says a goal was missed (MISSES, "below goal": a measurement all the same, and the
# stamp gives the exit status); otherwise its section stays as it was, its last lines are shown,
# and the script goes on to the next and exits 1 at the end. The benches run one at a time, each
# with one gorun build.
#
#   bench/report.sh                          # every section (about an hour on 2 cores)
#   bench/report.sh launch checkpoint        # some
#   DOC=/tmp/b.md SMOKE=1 bench/report.sh    # the smoke runs (to try this script; never commit)
#   GORUN_BIN=/path/to/gorun bench/report.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
DOC=${DOC:-$root/docs/benchmarks.md}
SMOKE=${SMOKE:-0}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-report.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
die() { echo "report.sh: $*" >&2; exit 1; }
[[ -f "$DOC" ]] || die "DOC=$DOC: no such file"
[[ "$SMOKE" =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"

# The sections, in the order they run, and the command of each: the command docs/benchmarks.md names for its
# figures (bench/NAME.sh with the settings they were measured with).
declare -A cmds=(
  [launch]="bench/launch.sh"
  [checkpoint]="bench/checkpoint.sh"
  [memory]='ROWS="ddp:4 zero1:4 zero2:4 fsdp:2 fsdp:4 fsdp:8 hsdp:4" bench/memory.sh'
  [memlimit]="bench/memlimit.sh"
  [modes]="bench/modes.sh"
  [threads]="REPS=3 bench/threads.sh"
  [trainer]="LAYERS=4 DMODEL=128 CONTEXT=128 GLOBAL=16 MICRO=16 REPS=5 bench/trainer.sh"
  [memcopy]="bench/memcopy.sh"
  [rendezvous]="bench/rendezvous.sh"
  [netfault]="RUNS=2 bench/netfault.sh"
  [chaos]='DURATION=240 PERIODS="60 15" SEED=1 JSON=1 bench/chaos.sh'
)
order=(launch checkpoint memory memlimit modes threads trainer memcopy rendezvous netfault chaos)
names=("$@")
((${#names[@]})) || names=("${order[@]}")
for n in "${names[@]}"; do
  [[ -n "${cmds[$n]:-}" ]] || die "no section '$n' (want some of: ${order[*]})"
  grep -qxF "<!-- report:$n begin -->" "$DOC" && grep -qxF "<!-- report:$n end -->" "$DOC" ||
    die "$DOC has no markers <!-- report:$n begin --> and <!-- report:$n end -->"
done

if [[ -n "${GORUN_BIN:-}" ]]; then
  [[ -x "$GORUN_BIN" ]] || die "GORUN_BIN=$GORUN_BIN is not an executable"
else
  (cd "$root" && go build -o "$tmp/bin/" ./cmd/gorun ./cmd/gorun-worker) || die "go build failed"
  GORUN_BIN=$tmp/bin/gorun
fi
commit=$(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)

# replace NAME FILE: DOC with the text between NAME's markers replaced by FILE's.
replace() {
  awk -v begin="<!-- report:$1 begin -->" -v end="<!-- report:$1 end -->" -v body="$2" '
    $0 == begin { print; while ((getline line < body) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }' "$DOC" >"$tmp/doc"
  cat "$tmp/doc" >"$DOC"
}

failed=()
for n in "${names[@]}"; do
  cmd=${cmds[$n]}
  if ((SMOKE)); then
    # A bench with no smoke mode would run in full: minutes where seconds were asked for.
    grep -q SMOKE "$here/$n.sh" || { echo "report.sh: bench/$n.sh has no smoke mode; skipped" >&2; failed+=("$n"); continue; }
    cmd="SMOKE=1 $cmd"
  fi
  echo "== $cmd" >&2
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  date=$(date -u '+%Y-%m-%d %H:%M UTC')
  rc=0
  (cd "$root" && GORUN_BIN=$GORUN_BIN bash -c "$cmd") >"$tmp/out" 2>&1 </dev/null || rc=$?
  status=
  if ((rc != 0)); then
    if grep -qE 'MISSES|below goal' "$tmp/out"; then
      status=" (exit status $rc: a goal missed)"
    else
      echo "report.sh: $n failed (exit $rc); its section is left as it was. Its last lines:" >&2
      tail -n 20 "$tmp/out" | sed 's/^/    /' >&2
      failed+=("$n")
      continue
    fi
  fi
  {
    echo "Measured at $commit on $date: $(nproc) CPUs ($cpu), load $load when it began$status;"
    echo "\`$cmd\`:"
    echo
    sed 's/^/    /' "$tmp/out"
  } >"$tmp/body"
  replace "$n" "$tmp/body"
  echo "report.sh: $n written" >&2
done
((${#failed[@]} == 0)) || die "failed: ${failed[*]}"
