// Package archtest holds the tests that keep gorun's structure and its
// documents true: who may import whom, the Layout of docs/design.md
// generated from the packages' doc comments, and the relative links of the
// README, docs/ and examples/.
package archtest
