// Package hsdp is hybrid sharded data parallelism for one flat parameter
// buffer: where a rank sits in a world of replicas x shards, which slice of
// the buffer it owns, and the collectives of a training step (gather the
// parameters, reduce the gradients, sum the step's loss and gradient norm).
package hsdp
