// Package e2e holds end-to-end tests that build the real gorun binary once
// (TestMain: go build ./cmd/gorun into a temporary directory) and run it as a
// user would: worker programs under /bin/sh, and the unchanged PyTorch DDP
// example in examples/ddp (skipped when /usr/bin/python3 cannot import torch,
// unless CI=true, where that is a failure).
//
//	go test ./test/e2e/ -v
//	GORUN_BIN=/path/to/gorun go test ./test/e2e/   # test a prebuilt binary
//	E2E_PYTHON=/usr/bin/python3                    # interpreter with torch (default)
//
// Every gorun run is bounded by a context timeout, stopped with SIGTERM then
// SIGKILL, and every process it started (found by a per-run marker in its
// environment) is killed in t.Cleanup; a run that leaves processes behind fails.
package e2e
