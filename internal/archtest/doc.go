// Package archtest holds the package rules of gorun's design (who may
// import whom, and what the lean gorun-worker binary may link) as a test
// over `go list -deps`; it has no code of its own.
package archtest
