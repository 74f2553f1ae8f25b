// Package testutil holds the helpers gorun's tests share: a goroutine-safe
// buffer, free loopback ports, in-process ranks, the PyTorch probe, and
// SkipOrFail for tests whose dependency is missing.
//
// Only tests and test-support packages (internal/etcdtest, test/slurm)
// import it; TestNoCommandLinksTestutil checks that no command does.
package testutil
