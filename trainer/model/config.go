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
