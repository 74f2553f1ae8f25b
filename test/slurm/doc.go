// Package slurmtest runs a real multi-node SLURM 22.05 cluster on this one
// machine (the scripts in lab/: munged, slurmctld and one slurmd per node,
// each node in its own UTS + mount namespace with host name nodeN at
// 127.0.171.N) for tests, and tests gorun against it.
//
//	go test ./test/slurm/ -v           # as root, with slurm-wlm installed
//	GORUN_BIN=/path/to/gorun go test ./test/slurm/
//
// Start takes a machine-wide lock (one cluster at a time), keeps all state
// in a temporary LAB_DIR, and in t.Cleanup checks that no job process is
// left on a node, stops every daemon (lab/slurm-down.sh) and checks that
// nothing it started survived. Without root or without the SLURM packages
// the tests skip, unless CI=true, where that is a failure.
package slurmtest
