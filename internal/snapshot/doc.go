// Package snapshot reads the slot files in which a worker's gorun Python
// package (python/gorun) keeps its rank's newest training-state snapshots,
// and verifies them; docs/snapshots-format.md describes the format byte by
// byte.
package snapshot
