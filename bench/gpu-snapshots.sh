#!/usr/bin/env bash
# bench/gpu-snapshots.sh — gorun snapshots on a CUDA machine (PyTorch 2.x, NCCL): one prepared run.
#
#   GORUN_BIN=path/to/gorun MB=1024 STEPS=12 [BANDWIDTH=0] bash bench/gpu-snapshots.sh [OUT_DIR]
#
# 1. The card, torch, NCCL and /dev/shm.
# 2. bench/gpu_snapshots.py: a state of 2 x MB megabytes on the GPU; the snapshot's device-to-host
#    bandwidth beside the copy engine's, the cost of a snapshot every step, and a restore onto the
#    device checked bit for bit.
# 3. A crash: gorun runs examples/pytorch/snapshots.py (NCCL, --model-mb MB, snapshots every step);
#    the worker is killed with SIGKILL after step KILL_AT; gorun restarts it and it restores on the
#    GPU from the snapshot. A fault-free run of the same script gives the reference final model;
#    the two are compared bit for bit.
# SMOKE=1 (bench/smoke.sh, CI, no GPU): step 2 on the CPU with a tiny state, its exit status saying
# whether a bit-identical restore was measured; step 3 is skipped (on the CPU it is what the e2e test
# TestSnapshotsWorkerKill asserts). Needs no network; leaves nothing behind but OUT_DIR (a temporary
# one by default, removed).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
if [[ -n "${1:-}" ]]; then
  out=$1
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
SMOKE=${SMOKE:-0}
py=${PYTHON:-python3}
bw_args=(--reps 5)
if [[ "$SMOKE" == 1 ]]; then
  MB=${MB:-1} py=${PYTHON:-/usr/bin/python3}
  bw_args=(--reps 1 --batch 4 --device cpu)
fi
MB=${MB:-1024}
STEPS=${STEPS:-12}
KILL_AT=${KILL_AT:-5}
GORUN=${GORUN_BIN:-$root/.devbuild/gorun}
export PYTHONUNBUFFERED=1

echo "== 1. machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>/dev/null || echo "no nvidia-smi here"
$py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
df -h /dev/shm | tail -1

if [[ "${BANDWIDTH:-1}" == 1 ]]; then
  echo "== 2. snapshot bandwidth (state 2 x $MB MB on the GPU)"
  timeout 240 $py "$root/bench/gpu_snapshots.py" --mb "$MB" "${bw_args[@]}" | tee "$out/bandwidth.txt"
  echo "bandwidth: exit ${PIPESTATUS[0]}"
  if [[ "$SMOKE" == 1 ]] && ! grep -q '"restored_bit_identical": true' "$out/bandwidth.txt"; then
    echo "smoke: no bit-identical restore measured"
    exit 1
  fi
fi
if [[ "$SMOKE" == 1 ]]; then
  exit 0
fi

echo "== 3. a crashed worker restores on the GPU"
[[ -x "$GORUN" ]] || { echo "no gorun at $GORUN: skipping the crash"; exit 0; }
run() { # run NAME [kill]: one gorun job of the example; its log in $out/NAME.log
  local name=$1 kill=${2:-} log=$out/$1.log
  "$GORUN" --standalone --nproc-per-node=1 --max-restarts=1 -- \
    $py "$root/examples/pytorch/snapshots.py" --model-mb "$MB" --steps "$STEPS" --out "$out/$name.pt" >"$log" 2>&1 &
  local g=$!
  (sleep 200; kill -TERM $g 2>/dev/null) &
  local watchdog=$!
  if [[ -n "$kill" ]]; then
    until grep -q "step $KILL_AT loss" "$log" || ! kill -0 $g 2>/dev/null; do sleep 0.1; done
    local w
    w=$(pgrep -P $g -f snapshots.py | head -1)
    echo "killing worker $w after step $KILL_AT"
    date +%s.%N >"$out/$name.killed"
    kill -9 "$w"
  fi
  wait $g
  echo "$name: gorun exited $?"
  kill $watchdog 2>/dev/null
}
run clean
run crash kill
grep -E 'restored|snapshot|step [0-9]+ loss' "$out/crash.log" | sed 's/^/  crash| /' | head -40
$py - "$out/clean.pt" "$out/crash.pt" <<'EOF'
import sys, torch
a, b = (torch.load(p, map_location="cpu") for p in sys.argv[1:3])
same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("final model after the crash bit-identical to the fault-free run:", "yes" if same else "NO")
sys.exit(0 if same else 1)
EOF
same=$?
rm -f "$out"/*.pt
exit $same
