# bench/lib.sh — what the embedded-trainer bench scripts share; source it, don't run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bench_init memory.sh            # here, root, tmp (removed at exit), die, agent's stop at exit
#   bench_positive LAYERS DMODEL    # each named variable a positive integer, or die
#   bench_modes $MODES              # each a parallel.mode, or die
#   bench_gorun                     # gorun: $GORUN_BIN, or a fresh go build ./cmd/gorun ./cmd/gorun-worker
#   bench_toml DIR MODE METRICS LOG_EVERY [EXTRA]   # DIR/train.toml of the bench model
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
