// Package comm runs collectives (all-reduce, reduce-scatter, all-gather,
// broadcast, barrier) between the worker processes of one training round,
// over pipelined rings of TCP or same-node Unix socket connections.
package comm
