// Package estimate predicts per-GPU training memory for DDP, ZeRO-1,
// ZeRO-2, ZeRO-3/FSDP and HSDP, split into parameters, gradients,
// optimizer state and activations.
package estimate
