# bench/lib.sh — what the embedded-trainer bench scripts share; source it, don't run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bench_init memory.sh            # here, root, tmp (removed at exit), die, agent's stop at exit
#   bench_positive LAYERS DMODEL    # each named variable a positive integer, or die
#   bench_modes $MODES              # each a parallel.mode, or die
#   bench_gorun                     # gorun: $GORUN_BIN, or a fresh go build ./cmd/gorun ./cmd/gorun-worker
#   bench_toml DIR MODE METRICS LOG_EVERY [EXTRA]   # DIR/train.toml of the bench model
#   bench_workers AGENT...          # "PID RANK" of each worker in the process trees of AGENTs
#   bench_number WHAT VALUE         # VALUE a finite number, or die (an empty or NaN column)
#
# SMOKE=1 (bench/smoke.sh, CI) asks a script for its smoke mode: tiny sizes, one repetition, a few
# seconds, and an exit status that says whether the bench could measure what it says (a worker
# found, a fault injected, a ratio that is a number), never whether a timing goal was met. Scripts
# that do not source this file read SMOKE themselves, the same way.
#
# The script's gorun agent, when it has one running, goes in $agent: at exit (or INT or TERM) it gets
# SIGTERM, which makes gorun stop its own workers, and the script waits for it. GORUN_BIN is read
# once and unset, so no gorun the script starts sees it (gorun warns about unknown GORUN_ variables).

# bench_init NAME sets here (bench/), root (the repository) and tmp (a fresh directory, removed at
# exit), defines die (a message prefixed with NAME, exit 1) and the cleanup at exit.
bench_init() {
  bench_name=$1
  here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
  root=$(cd "$here/.." && pwd)
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-${bench_name%.sh}.XXXXXX")
  agent=
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  bench_bin=${GORUN_BIN:-}
  unset GORUN_BIN
  SMOKE=${SMOKE:-0}
  [[ "$SMOKE" =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"
}

bench_cleanup() {
  if [[ -n "${agent:-}" ]] && kill -0 "$agent" 2>/dev/null; then
    kill -TERM "$agent" 2>/dev/null || true # gorun stops its own workers on SIGTERM
    wait "$agent" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}

die() { echo "$bench_name: $*" >&2; exit 1; }

# bench_positive VAR... dies unless every named variable holds a positive integer.
bench_positive() {
  local v
  for v in "$@"; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
  done
}

# bench_modes MODE... dies unless every argument is a parallel.mode.
bench_modes() {
  local m
  for m in "$@"; do
    [[ "$m" =~ ^(ddp|zero1|zero2|zero3|fsdp|hsdp)$ ]] || die "bad mode '$m': want ddp zero1 zero2 zero3 fsdp hsdp"
  done
}

# bench_gorun sets gorun to the binary GORUN_BIN named (which runs train.toml workers with the
# gorun-worker beside it, if any), or builds ./cmd/gorun and ./cmd/gorun-worker into tmp.
bench_gorun() {
  if [[ -n "$bench_bin" ]]; then
    [[ -x "$bench_bin" ]] || die "GORUN_BIN=$bench_bin is not an executable"
    gorun=$bench_bin
  else
    gorun=$tmp/gorun
    (cd "$root" && go build -o "$tmp/" ./cmd/gorun ./cmd/gorun-worker) || die "go build ./cmd/gorun ./cmd/gorun-worker failed"
  fi
}

# bench_toml DIR MODE METRICS LOG_EVERY [EXTRA] writes DIR/train.toml (DIR made if need be): the model
# of LAYERS, DMODEL, HEADS and CONTEXT, STEPS steps of GLOBAL sequences in micro batches of MICRO, one
# warmup step, parallel.mode MODE, train.metrics METRICS ("" for none) and log_every LOG_EVERY; EXTRA,
# when given, is appended as it is (more sections).
bench_toml() {
  mkdir -p "$1"
  cat >"$1/train.toml" <<EOF
[model]
layers = $LAYERS
d_model = $DMODEL
heads = $HEADS
context = $CONTEXT

[train]
steps = $STEPS
global_batch = $GLOBAL
micro_batch = $MICRO
log_every = $4
metrics = "$3"

[optim]
warmup = 1

[parallel]
mode = "$2"
EOF
  if [[ -n "${5:-}" ]]; then printf '\n%s\n' "$5" >>"$1/train.toml"; fi
}

# bench_workers AGENT... prints "PID RANK" for every worker process of the given agents (gorun
# processes this script started), one a line. A worker is found through the process tree, never
# by its command line (which changes: `gorun worker`, gorun-worker, a wrapper such as prlimit, a
# user's script): walking down from each agent, the first process whose environment carries the
# worker contract (TORCHELASTIC_RUN_ID, with RANK) that its agent's environment does not is a
# worker; what it starts is its own and is not descended into. The agent's other children (its
# guard helper, an embedded etcd) carry no such variable. A Go program forks from several threads,
# so every thread's list of children is read. A process gone before its files are read is skipped.
bench_workers() {
  local agent pid run own rank
  local -a queue
  for agent in "$@"; do
    own=$(bench_env "$agent" TORCHELASTIC_RUN_ID) || continue
    queue=($(cat /proc/"$agent"/task/*/children 2>/dev/null))
    while ((${#queue[@]})); do
      pid=${queue[0]}
      queue=("${queue[@]:1}")
      run=$(bench_env "$pid" TORCHELASTIC_RUN_ID) || continue
      rank=$(bench_env "$pid" RANK) || continue
      if [[ -n "$run" && "$run" != "$own" && -n "$rank" ]]; then
        echo "$pid $rank"
        continue
      fi
      queue+=($(cat /proc/"$pid"/task/*/children 2>/dev/null))
    done
  done
}

# bench_env PID NAME prints the value of NAME in PID's environment (empty when unset); it fails
# when the environment cannot be read (the process is gone, or another user's).
bench_env() {
  local line
  [[ -r /proc/$1/environ ]] || return 1
  while IFS= read -r -d '' line; do
    if [[ "$line" == "$2="* ]]; then
      echo "${line#*=}"
      return 0
    fi
  done 2>/dev/null </proc/"$1"/environ || [[ -e /proc/$1 ]] || return 1
  echo
}

# bench_number WHAT VALUE dies unless VALUE is a finite decimal number: a ratio or a rate that came
# out empty, NaN or infinite means the bench measured nothing, which the smoke run must not pass.
bench_number() {
  [[ "$2" =~ ^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?x?$ ]] || die "$1 is '$2', not a number: the bench measured nothing"
}
