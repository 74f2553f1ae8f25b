#!/usr/bin/env bash
# bench/trainer.sh — embedded trainer throughput next to the same GPT in PyTorch (CPU), in one run.
#
# One process each, the same shapes and batch as examples/train.toml (2 layers, d_model 64, 4 heads,
# context 64, global batch 32 in micro batches of 8), the same corpus, the same thread count:
#   gorun     WORLD_SIZE=1 gorun worker bench.toml --threads N   (tokens/s from its metrics file)
#   torch     /usr/bin/python3 bench/torch_gpt.py --threads N    (torch.set_num_threads(N); float32,
#             autograd, AdamW, clip_grad_norm_; Debian's python3-torch)
# Each side trains STEPS optimizer steps; the first SKIP are left out of the timing. The two sides
# alternate REPS times (order swapped every repetition); ours/torch is the median of the ratios of
# adjacent pairs, robust to a shared machine's drifting load. Goal: ours/torch >= 1.0 (exit status 1
# if a row misses it; GOAL=... to change).
#
#   bench/trainer.sh                              # THREADS="1 2" REPS=3 STEPS=25 SKIP=5
#   THREADS="1 2 4" REPS=5 bench/trainer.sh
#   TORCH_LD_LIBRARY_PATH=/opt/openblas/lib bench/trainer.sh   # PyTorch over another libblas.so.3
#   GORUN_BIN=/path/to/gorun PYTHON=/path/to/python3 bench/trainer.sh
set -euo pipefail

THREADS=${THREADS:-1 2}
REPS=${REPS:-3}
STEPS=${STEPS:-25}
SKIP=${SKIP:-5}
GOAL=${GOAL:-1.0}
PYTHON=${PYTHON:-/usr/bin/python3}
LAYERS=2 DMODEL=64 HEADS=4 CONTEXT=64 GLOBAL=32 MICRO=8

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gorun-trainerbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

die() { echo "trainer.sh: $*" >&2; exit 1; }
for v in REPS STEPS; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"; done
[[ "$SKIP" =~ ^[0-9]+$ ]] && (( SKIP < STEPS )) || die "SKIP must be an integer below STEPS, got '$SKIP'"
for n in $THREADS; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "bad thread count '$n'"; done
"$PYTHON" -c 'import torch, numpy' 2>/dev/null || die "$PYTHON cannot import torch and numpy (apt-get install python3-torch)"

if [[ -n "${GORUN_BIN:-}" ]]; then
  gorun=$GORUN_BIN
else
  gorun=$tmp/gorun
  (cd "$root" && go build -o "$gorun" ./cmd/gorun) || die "go build ./cmd/gorun failed"
fi

# The corpus of examples/train.toml, in one file both sides read.
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
micro_batch = $MICRO
log_every = 1000000
metrics = ""

[optim]
lr = 1e-2
min_lr = 1e-3
warmup = $(( STEPS < 20 ? STEPS : 20 ))
EOF

# ours N: tokens/s of the embedded trainer on N threads, steps SKIP+1 .. STEPS.
ours() {
  rm -f "$tmp/m.jsonl"
  env -u RANK -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT WORLD_SIZE=1 \
    "$gorun" worker "$tmp/bench.toml" --threads "$1" --metrics "$tmp/m.jsonl" >/dev/null || die "gorun worker failed"
  awk -v skip="$SKIP" -v steps="$STEPS" -v tok=$(( GLOBAL * CONTEXT )) '
    { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /"elapsed_s":[0-9.e+-]+/); e[s] = substr($0, RSTART + 12, RLENGTH - 12) + 0 }
    END { printf "%.1f\n", (steps - skip) * tok / (e[steps] - e[skip]) }' "$tmp/m.jsonl"
}
# torch N: tokens/s of bench/torch_gpt.py on N threads.
torch() {
  local out
  out=$(LD_LIBRARY_PATH=${TORCH_LD_LIBRARY_PATH:-${LD_LIBRARY_PATH:-}} OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1 "$PYTHON" "$here/torch_gpt.py" \
    --corpus "$tmp/corpus.txt" --layers $LAYERS --d-model $DMODEL --heads $HEADS --context $CONTEXT \
    --global-batch $GLOBAL --micro-batch $MICRO --steps "$STEPS" --skip "$SKIP" --threads "$1") || die "torch_gpt.py failed"
  sed -n 's/.*"tokens_per_s": \([0-9.e+-]*\).*/\1/p' <<<"$out"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

blas=$(LD_LIBRARY_PATH=${TORCH_LD_LIBRARY_PATH:-${LD_LIBRARY_PATH:-}} "$PYTHON" -c '
import re, torch
cfg = torch.__config__.show()
m = re.search(r"BLAS_INFO=(\w+)", cfg)
print("torch", torch.__version__, "BLAS_INFO=" + (m.group(1) if m else "?"))')
echo "trainer throughput: ${LAYERS} layers, d_model $DMODEL, $HEADS heads, context $CONTEXT, batch $GLOBAL (micro $MICRO);"
echo "  steps $((SKIP + 1))..$STEPS timed, $REPS reps, medians; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  gorun $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?'); $blas; libblas.so.3 -> $(readlink -f /lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')${TORCH_LD_LIBRARY_PATH:+ (torch: LD_LIBRARY_PATH=$TORCH_LD_LIBRARY_PATH)}"
echo

for (( i = 0; i < REPS; i++ )); do
  for n in $THREADS; do
    order="ours torch"; (( i % 2 )) && order="torch ours"
    for who in $order; do
      "$who" "$n" >>"$tmp/$who.$n"
    done
  done
done

printf '%-7s | %12s %12s | %11s\n' threads "gorun tok/s" "torch tok/s" "gorun/torch"
verdict=0
for n in $THREADS; do
  o=$(median <"$tmp/ours.$n"); p=$(median <"$tmp/torch.$n")
  ratio=$(paste "$tmp/ours.$n" "$tmp/torch.$n" | awk '{ print $1 / $2 }' | median)
  ok=$(awk -v r="$ratio" -v g="$GOAL" 'BEGIN { print (r >= g) ? "" : "  (below goal " g ")" }')
  [[ -z "$ok" ]] || verdict=1
  printf '%-7s | %12.0f %12.0f | %10.2fx%s\n' "$n" "$o" "$p" "$ratio" "$ok"
done
exit $verdict
