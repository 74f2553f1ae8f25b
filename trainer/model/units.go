package model

// Weights gives a pass the parameters one unit (see Layout.Units) at a time, so that a sharded
// trainer needs the whole of only one unit at once.
type Weights interface {
	// Unit returns the parameters of unit u, Units()[u].Len() elements. The pass reads them
	// only until its next call of Unit, so an implementation may reuse that memory then. An
	// error (a peer that did not send its part, say) ends the pass with that error.
	//
	// A forward pass asks for the embeddings (0), the blocks in order (1 to Layers), the final
	// layer norm (Layers+1), then the embeddings again (the output projection is tied to wte);
	// a backward pass asks for the embeddings, the final layer norm, then the blocks from the
	// last to the first.
	Unit(u int) ([]float32, error)
}

// Grads takes the gradients of a backward pass one unit at a time.
type Grads interface {
	// Grad returns the buffer unit u's gradient is added to, Units()[u].Len() elements. The
	// pass may ask again for the same unit before Done(u), and must then get the same buffer.
	// An error ends the pass with that error.
	//
	// A backward pass asks for the embeddings (the tied output projection's part of wte's
	// gradient), the final layer norm, the blocks from the last to the first, and the
	// embeddings again.
	Grad(u int) ([]float32, error)
	// Done says the pass has added all of unit u's gradient; the buffer is the implementation's
	// again, to reduce or reuse. A backward pass calls it once per unit, in the order it
	// finishes them: the final layer norm, the blocks from the last to the first, then the
	// embeddings. An error ends the pass with that error.
	Done(u int) error
}

// flat is one buffer of the whole layout, as Weights and Grads: unit u is its elements
// [Lo, Hi), and Done does nothing.
type flat struct {
	units []Unit
	buf   []float32
}

func (f flat) Unit(u int) ([]float32, error) {
	return f.buf[f.units[u].Lo:f.units[u].Hi], nil
}

func (f flat) Grad(u int) ([]float32, error) { return f.Unit(u) }

func (f flat) Done(int) error { return nil }

// WeightsOrder is the order in which a forward pass and then a backward
// pass of a model of layout l ask Weights for units (see Weights): a
// caller that knows it can fetch a unit before the pass asks for it.
func (l Layout) WeightsOrder() []int {
	units := len(l.Units())
	order := make([]int, 0, 2*units+1)
	for u := range units { // forward: every unit in order, then the tied wte
		order = append(order, u)
	}
	order = append(order, 0, 0, units-1) // backward: wte, ln_f, then the blocks, last first
	for u := units - 2; u >= 1; u-- {
		order = append(order, u)
	}
	return order
}
