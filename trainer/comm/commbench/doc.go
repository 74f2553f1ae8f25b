// Package commbench measures trainer/comm's collectives beside
// torch.distributed's gloo backend, both as real processes on this machine,
// for `gorun bench comm`.
package commbench
