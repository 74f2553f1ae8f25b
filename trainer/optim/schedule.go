package optim

import (
	"errors"
	"fmt"
	"math"
)

// Config is [optim] of train.toml plus the number of optimizer steps of the whole run.
type Config struct {
	LR          float64 // peak learning rate, reached at the end of warmup
	MinLR       float64 // learning rate at the end of the cosine decay
	Warmup      int     // steps of linear warmup
	Steps       int     // optimizer steps of the whole run ([train] steps)
	Beta1       float64
	Beta2       float64
	Eps         float64
	WeightDecay float64 // decoupled: p -= lr * WeightDecay * p on the decayed tensors (model.Layout.DecaySpans)
	GradClip    float64 // maximum global gradient norm; 0 disables clipping
}

// Validate reports every field that is out of range, joined into one error.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("optim: "+format, a...)) }
	// Comparisons are written so that NaN fails them.
	if !(c.LR > 0) || math.IsInf(c.LR, 0) {
		bad("lr = %g, want > 0", c.LR)
	}
	if !(c.MinLR >= 0 && c.MinLR <= c.LR) {
		bad("min_lr = %g, want between 0 and lr = %g", c.MinLR, c.LR)
	}
	if c.Steps < 1 {
		bad("steps = %d, want >= 1", c.Steps)
	}
	if c.Warmup < 0 || c.Warmup > c.Steps {
		bad("warmup = %d, want between 0 and steps = %d", c.Warmup, c.Steps)
	}
	if !(c.Beta1 >= 0 && c.Beta1 < 1) {
		bad("beta1 = %g, want in [0, 1)", c.Beta1)
	}
	if !(c.Beta2 >= 0 && c.Beta2 < 1) {
		bad("beta2 = %g, want in [0, 1)", c.Beta2)
	}
	if !(c.Eps > 0) || math.IsInf(c.Eps, 0) {
		bad("eps = %g, want > 0", c.Eps)
	}
	if !(c.WeightDecay >= 0) || math.IsInf(c.WeightDecay, 0) {
		bad("weight_decay = %g, want >= 0", c.WeightDecay)
	}
	if !(c.GradClip >= 0) || math.IsInf(c.GradClip, 0) {
		bad("grad_clip = %g, want >= 0 (0 disables clipping)", c.GradClip)
	}
	return errors.Join(errs...)
}

// LRAt returns the learning rate of update number step, counted from 0: a linear warmup
// LR*(step+1)/Warmup over the first Warmup updates, then a cosine decay from LR at step Warmup
// to MinLR at step Steps, and MinLR from then on.
func (c Config) LRAt(step int) float64 {
	switch {
	case step < c.Warmup:
		return c.LR * float64(step+1) / float64(c.Warmup)
	case step >= c.Steps:
		return c.MinLR
	}
	ratio := float64(step-c.Warmup) / float64(c.Steps-c.Warmup)
	return c.MinLR + 0.5*(1+math.Cos(math.Pi*ratio))*(c.LR-c.MinLR)
}
