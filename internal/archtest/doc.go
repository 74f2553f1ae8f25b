// Package archtest holds the tests that keep gorun's structure and its
// documents true: the package rules of the design (who may import whom,
// and what the lean gorun-worker binary may link) over `go list -deps`,
// the Layout of docs/design.md generated from the packages' doc comments,
// and the relative links of the README, docs/ and examples/; it has no
// code of its own.
package archtest
