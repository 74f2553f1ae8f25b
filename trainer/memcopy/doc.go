// Package memcopy keeps memory copies of the training state: after a
// completed step, each rank's shard of the parameters and of AdamW also
// lives in the memory of a buddy rank on the next node, sent in the
// background, so that a layout without a replica on another node (fsdp
// across nodes) recovers from memory, not from disk, after it loses one
// node ([checkpoint] memory = true in train.toml).
package memcopy
