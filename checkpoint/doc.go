// Package checkpoint saves and loads named float32 tensors as distributed sharded checkpoints
// (one directory per step, one data file per writing rank, a JSON manifest committed last) and
// reads them back at any other world layout, verifying crc32c checksums as it goes.
package checkpoint
