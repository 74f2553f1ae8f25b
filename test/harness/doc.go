// Package harness is what the process-level tests (test/e2e, test/slurm) share: a job's
// metrics records and checkpoints as the tests compare them, the processes a run started
// (found by an environment marker), and the tail of an output.
package harness
