#!/usr/bin/env bash
# scripts/run.sh — build gorun (and gorun-worker, its trainer worker) and run the main job on this machine: the
# embedded pure-Go trainer (examples/train.toml: a byte-level GPT on Go
# sources) on local workers, hybrid-sharded. Extra arguments go to gorun,
# after the config: e.g. --set train.steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
mkdir -p bin
go build -o bin/ ./cmd/gorun ./cmd/gorun-worker
exec bin/gorun --nproc-per-node="${NPROC:-2}" examples/train.toml "$@"
