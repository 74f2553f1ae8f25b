// Package shard holds State, one rank's slice of the trainer's flat buffers at a step: the
// type that package trainer and package resume share, so that resume need not import trainer.
package shard
