package model

// Option changes how New sets a Model up.
type Option func(*options)

type options struct {
	checkpointing bool
}

// WithActivationCheckpointing turns activation (gradient) checkpointing on or off (the default).
// With it on, the forward pass keeps only each block's input, the residual stream entering the
// block, and the backward pass recomputes a block's activations from that input, with the
// block weights it asks Weights for anyway, just before the block's backward: New allocates the
// activations of one block instead of one per block, at the cost of running most of each
// block's forward twice (Config.RecomputeFLOPsPerToken). The losses and gradients are the same
// bits either way, and so are the orders of the calls of Weights and Grads.
func WithActivationCheckpointing(on bool) Option {
	return func(o *options) { o.checkpointing = on }
}

func collect(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
