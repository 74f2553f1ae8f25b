package model

import (
	"errors"
	"fmt"
)

// Config is the shape of the transformer: [model] in train.toml plus the vocabulary size.
type Config struct {
	Layers  int // transformer blocks
	DModel  int // width of the residual stream
	Heads   int // attention heads; DModel must be a multiple of Heads
	Context int // tokens (bytes) per sequence
	Vocab   int // 256 for bytes; at most 256, since tokens are bytes
}

// Validate reports every field that is out of range, joined into one error.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("model: %s = %d, want >= 1", name, v))
		}
	}
	positive("layers", c.Layers)
	positive("d_model", c.DModel)
	positive("heads", c.Heads)
	positive("context", c.Context)
	positive("vocab", c.Vocab)
	if c.Vocab > 256 {
		errs = append(errs, fmt.Errorf("model: vocab = %d, want <= 256 (tokens are bytes)", c.Vocab))
	}
	if c.DModel >= 1 && c.Heads >= 1 && c.DModel%c.Heads != 0 {
		errs = append(errs, fmt.Errorf("model: d_model = %d is not a multiple of heads = %d", c.DModel, c.Heads))
	}
	// Keep every buffer far from int overflow and from absurd allocations.
	const maxDim = 1 << 16
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", c.Layers}, {"d_model", c.DModel}, {"heads", c.Heads}, {"context", c.Context}} {
		if f.v > maxDim {
			errs = append(errs, fmt.Errorf("model: %s = %d, want <= %d", f.name, f.v, maxDim))
		}
	}
	return errors.Join(errs...)
}

// TrainFLOPsPerToken is the model FLOPs of one training token, forward and
// backward (backward twice forward), counting a multiply-add as 2 and only
// the matrix products, as PaLM's MFU does:
//
//	6·(12·L·d² + V·d) + 12·L·T·d
//
// 12·L·d² are the weights of the blocks' products (QKV 3d², attention
// output d², MLP 8d²) and V·d the output projection (tied with the
// embedding, whose lookup is free); 12·L·T·d is attention's q·kᵀ and P·v
// over the whole context T, 2·T·d each forward, with no saving for the
// causal mask (the kernels compute the full T×T products too). LayerNorm,
// GELU, softmax and AdamW are left out.
func (c Config) TrainFLOPsPerToken() float64 {
	l, d, t, v := float64(c.Layers), float64(c.DModel), float64(c.Context), float64(c.Vocab)
	return 6*(12*l*d*d+v*d) + 12*l*t*d
}

// RecomputeFLOPsPerToken is what activation checkpointing (WithActivationCheckpointing) adds to
// TrainFLOPsPerToken, counted the same way: the backward pass recomputes the forward pass of
// every block but the last, whose activations are still there after the forward pass, without
// the MLP's output projection, which the backward pass does not need:
//
//	(L-1)·(2·8·d² + 4·T·d)
//
// 8d² being the weights of QKV (3d²), the attention output (d²) and c_fc (4d²), and 4·T·d
// attention's q·kᵀ and P·v.
func (c Config) RecomputeFLOPsPerToken() float64 {
	l, d, t := float64(c.Layers), float64(c.DModel), float64(c.Context)
	return max(l-1, 0) * (16*d*d + 4*t*d)
}
