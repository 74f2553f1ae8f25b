package model

// Weights gives a pass the parameters one unit (see Layout.Units) at a time, so that a sharded
// trainer needs the whole of only one unit at once.
type Weights interface {
	// Unit returns the parameters of unit u, Units()[u].Len() elements. The pass reads them
	// only until its next call of Unit, so an implementation may reuse that memory then. An
	// error (a peer that did not send its part, say) ends the pass with that error.
	//
	// A forward pass asks for the embeddings (0), the blocks' parts in order, the final layer
	// norm (the last unit), then the embeddings again (the output projection is tied to wte);
	// a backward pass asks for the embeddings, the final layer norm, then each block from the
	// last to the first, its parts last first (with activation checkpointing, a block whose
	// activations it recomputes first asks for the parts its forward pass reads). Model's
	// WeightsOrder lists the order.
	Unit(u int) ([]float32, error)
}

// Grads takes the gradients of a backward pass one unit at a time.
type Grads interface {
	// Grad returns the buffer unit u's gradient is added to, Units()[u].Len() elements. The
	// pass may ask again for the same unit before Done(u), and must then get the same buffer.
	// An error ends the pass with that error.
	//
	// A backward pass asks for the embeddings (the tied output projection's part of wte's
	// gradient), the final layer norm, the blocks' parts from the last to the first, and the
	// embeddings again.
	Grad(u int) ([]float32, error)
	// Done says the pass has added all of unit u's gradient; the buffer is the implementation's
	// again, to reduce or reuse. A backward pass calls it once per unit, in the order it
	// finishes them: the final layer norm, the blocks' parts from the last to the first, then
	// the embeddings; it is done with one block part before it asks for the next one's. An error ends the pass with that error.
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
// pass of m ask Weights for units (see Weights): a caller that knows it
// can fetch a unit before the pass asks for it. A block that is one unit
// is asked for once per part, so the same unit several times in a row.
func (m *Model) WeightsOrder() []int {
	final := len(m.units) - 1
	order := make([]int, 0, 3*partsPerBlock*m.cfg.Layers+6)
	order = append(order, 0) // forward: the embeddings, every block's parts, ln_f, the tied wte
	for l := range m.cfg.Layers {
		for p := range partsPerBlock {
			order = append(order, m.blockUnit(l, p))
		}
	}
	order = append(order, final, 0, 0, final) // backward: wte, ln_f, then the blocks, last first
	for l := m.cfg.Layers - 1; l >= 0; l-- {
		if m.checkpointing && l != m.cfg.Layers-1 { // the recomputed forward pass, without mlpOut
			order = append(order, m.blockUnit(l, attnIn), m.blockUnit(l, attnOut), m.blockUnit(l, mlpIn))
		}
		order = append(order, m.blockUnit(l, mlpOut), m.blockUnit(l, mlpIn), m.blockUnit(l, attnOut), m.blockUnit(l, attnIn))
	}
	return order
}
