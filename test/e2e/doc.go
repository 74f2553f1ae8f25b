// Package e2e holds end-to-end tests that build the real gorun binary once
// (TestMain: go build ./cmd/gorun ./cmd/gorun-worker into a temporary directory) and run it as a
// user would: worker programs under /bin/sh, and the unchanged PyTorch DDP
// example in examples/ddp (skipped when /usr/bin/python3 cannot import torch,
// unless CI=true, where that is a failure).
//
//	go test ./test/e2e/ -v
//	GORUN_BIN=/path/to/gorun go test ./test/e2e/   # test a prebuilt binary
//	E2E_PYTHON=/usr/bin/python3                    # interpreter with torch (default)
//	GORUN_NETFAULT=all go test ./test/e2e/ -run TestNetFaults -v   # every network fault
//
// TestNetFaults (issue 19's network faults) needs root, ip and nft: it puts the agents and
// etcd in network namespaces of their own behind a bridge and drops packets with nftables
// (netLab); it skips without them, or fails when CI=true.
//
// Every gorun run is bounded by a context timeout, stopped with SIGTERM then
// SIGKILL, and every process it started (found by a per-run marker in its
// environment) is killed in t.Cleanup; a run that leaves processes behind fails.
package e2e
