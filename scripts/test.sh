#!/usr/bin/env bash
# scripts/test.sh — install what the tests need (when missing) and run them all.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

# Debian packages the tests use: real PyTorch (CPU) for the DDP tests and the
# launch benchmark, slurm-client's scontrol for the hostlist comparison,
# etcd-server's etcd 3.4 (/usr/bin/etcd) for the cross-version etcd tests,
# etcd-client's etcdctl for the rendezvous auth tests (a client without the
# job secret is refused),
# slurm-wlm (slurmctld, slurmd), munge and iproute2's ss for the real SLURM
# cluster of test/slurm, prometheus (prometheus, promtool) for the metrics
# tests, iproute2's ip and nftables' nft for the network faults of
# test/e2e TestNetFaults (network namespaces, drops on a bridge). A test whose dependency is missing skips, except when
# CI=true (CI sets it): then it fails, so that a broken set-up cannot pass.
need=()
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need+=(python3-torch)
command -v scontrol >/dev/null 2>&1 || need+=(slurm-client)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v ss >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
if ((${#need[@]})); then
  echo "== apt-get install ${need[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  # policy-rc.d keeps apt from starting services (etcd, munge, slurm) on
  # install; one already there (Docker images have one) is left as it is.
  made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if [ -n "$made_policy" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
fi

# Each step's seconds, printed at the end: where CI's time goes.
timings=()
step_start=0
lap() { timings+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$1")"); step_start=$SECONDS; }
# A step run in the background (the python tests) is waited for when another step fails: it
# ends by itself, and killing it would leave the processes it started behind.
background=()
on_exit() {
  if ((${#background[@]})); then wait "${background[@]}" 2>/dev/null || true; fi
  printf "%s\n" "== seconds per step" "${timings[@]}"
}
trap on_exit EXIT
# beside starts a command in the background, its output kept aside (one at a time);
# finish_beside NAME waits for it, prints its output and fails the script if it failed.
beside() {
  beside_log=$(mktemp)
  "$@" >"$beside_log" 2>&1 &
  beside_pid=$!
  background+=("$beside_pid")
}
finish_beside() {
  local rc=0
  wait "$beside_pid" || rc=$?
  background=()
  echo "== $1: its output"
  cat "$beside_log"
  rm -f "$beside_log"
  ((rc == 0)) || { echo "$1 failed (exit $rc)"; exit 1; }
}

lap "apt-get install (when missing)"
echo "== gofmt, go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi
go vet ./...
lap "gofmt, go vet"

# The concurrency-heavy packages run under the race detector only: the same
# tests again without it would find nothing the race run does not (it runs
# every test of the package, only slower). One exception runs in both:
# rendezvous/etcdembed, whose TestServerClusterStartsRepeatedly starts its
# cluster 6 times under -race and 50 times without.
race_pkgs=(./internal/... ./elastic/... ./rendezvous/... ./trainer/comm/...)
echo "== go test -race (concurrency-heavy packages)"
go test -race -count=1 -timeout 10m "${race_pkgs[@]}"
lap "go test -race"

echo "== go test (all others)"
mapfile -t plain_pkgs < <(comm -23 <(go list ./... | sort) \
  <(go list "${race_pkgs[@]}" | grep -vx 'github.com/gorun/gorun/rendezvous/etcdembed' | sort))
# The end-to-end packages run after the others, test/e2e alone: its scenarios use both cores.
# The others (unit tests, most of them waiting on an etcd or a process) run two packages at a
# time. TestNetFaults is skipped here because the bench smoke below runs it (bench/netfault.sh
# SMOKE=1: its default scenarios and their final-model comparison, every assertion of the
# test), so CI runs it once.
e2e_pkgs=(github.com/gorun/gorun/test/e2e github.com/gorun/gorun/test/slurm)
mapfile -t unit_pkgs < <(printf '%s\n' "${plain_pkgs[@]}" | grep -vxF -f <(printf '%s\n' "${e2e_pkgs[@]}"))
go test -count=1 -timeout 15m "${unit_pkgs[@]}"
go test -count=1 -timeout 20m -skip '^TestNetFaults$' ./test/e2e
lap "go test (all others but test/slurm)"

# The PyTorch side's pure-Python package (python/gorun): its unit tests, on Debian's torch. They
# run beside the fuzz step below (neither asserts a time, and each leaves a core idle half of its
# run); their output is shown once the fuzz step is done.
echo "== python tests (python/gorun), beside the fuzz step"
beside /usr/bin/python3 -m unittest discover -s python/tests -t python

# Every fuzz target in the tree (func FuzzXxx in a _test.go), each for a
# bounded number of inputs: the runs above only replayed their seeds and
# testdata corpora. GORUN_FUZZTIME sets the budget per target (Nx for N
# inputs, or a Go duration). The default is a count, not a duration: with
# a duration, Go 1.26's fuzzing coordinator can report "context deadline
# exceeded" as a failure when the time runs out while a worker is busy
# (go.dev/issue/75804, fixed in Go 1.27), with no failing input; a count
# has no deadline to race. 20000 inputs take 1-5 s per target here. A
# failure leaves its input under the package's testdata/fuzz/, to commit
# as a seed once fixed.
fuzztime=${GORUN_FUZZTIME:-20000x}
echo "== go test -fuzz (each fuzz target for $fuzztime)"
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r file; do
  for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    echo "-- $name ($(dirname "$file"))"
    go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 1000x "$(dirname "$file")"
  done
done
finish_beside "python tests (python/gorun)"
lap "go test -fuzz and python tests"

# test/slurm waits on its SLURM cluster most of its run (42 % of the 2 cores busy, sampled), and
# the bench smoke judges no time: they run side by side, test/slurm's output after the smoke's.
echo "== go test ./test/slurm, beside the bench smoke"
beside go test -count=1 -timeout 20m ./test/slurm

# Every bench script in its smoke mode (tiny sizes, one repetition; bench/smoke.sh prints the
# seconds each took): a bench that can no longer measure what it says fails here, a timing goal
# never does.
echo "== bench smoke (SMOKE=1 bench/*.sh)"
bash bench/smoke.sh
lap "bench smoke"
finish_beside "go test ./test/slurm"
lap "go test ./test/slurm (the rest of it)"
# The launch path's own benchmark (4 workers started as the agent starts them, against os/exec
# alone; it prints the ratio, x-bare): 5 launches, to fail when it cannot launch.
go test -run '^$' -bench Launch4 -benchtime 5x ./internal/proc/
lap "launch benchmark"
