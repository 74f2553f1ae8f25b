package model

// Option changes how New sets a Model up.
type Option func(*options)

type options struct {
	checkpointing bool
	// splitFrom is the block size from which the units split blocks into their parts (see
	// Layout.Units); 0: splitBlocksFrom.
	splitFrom int
}

// splitBlocksAt makes the Model's units split every block of at least n parameters into its
// parts (n = 1: every block), for tests of small models.
func splitBlocksAt(n int) Option {
	return func(o *options) { o.splitFrom = n }
}

// WithActivationCheckpointing turns activation (gradient) checkpointing on or off (the default).
// With it on, the forward pass keeps only each block's input, the residual stream entering the
// block, and the backward pass recomputes a block's activations from that input, with the
// block weights it asks Weights for anyway, just before the block's backward: New allocates the
// activations of one block instead of one per block, at the cost of running most of each
// block's forward twice (Config.RecomputeFLOPsPerToken). The losses and gradients are the same
// bits either way, and so is the order of the calls of Grads; Weights is asked again for the
// parts a recomputed block's forward pass reads (see Model.WeightsOrder).
func WithActivationCheckpointing(on bool) Option {
	return func(o *options) { o.checkpointing = on }
}

func collect(opts []Option) options {
	o := options{splitFrom: splitBlocksFrom}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
