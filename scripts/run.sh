#!/usr/bin/env bash
# scripts/run.sh — build gorun and run the main job on this machine: an
# unchanged PyTorch DDP script on 4 local workers (the embedded pure-Go
# trainer replaces it as the main job once it lands).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
mkdir -p bin
go build -o bin/gorun ./cmd/gorun
out=$(mktemp -d)
PYTHON=/usr/bin/python3 bin/gorun --standalone --nproc-per-node="${NPROC:-4}" examples/ddp/train.py --out "$out" "$@"
echo "final parameters of each rank (identical across ranks):"
cat "$out"/*.sha256 2>/dev/null || ls "$out"
rm -rf "$out"
