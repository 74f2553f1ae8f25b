// Package snapshot reads, verifies and writes the slot files in which each
// rank keeps its newest training-state snapshots (format version 2,
// docs/snapshots-format.md), computes their payloads' CRCs for the Python
// workers on the agent's socket (CRCServer), and computes the pure
// agreement (Agree) by which the agents of a round choose the one step
// every rank restores.
package snapshot
