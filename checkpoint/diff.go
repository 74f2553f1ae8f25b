package checkpoint

import (
	"context"
	"fmt"
	"math"
	"slices"
)

// diffWindow is how many elements of each tensor Diff holds at a time.
const diffWindow = 1 << 20

// TensorDiff compares one tensor of two checkpoints.
type TensorDiff struct {
	Name   string
	InA    bool
	InB    bool
	ShapeA []int64
	ShapeB []int64
	// MaxAbs is the largest |a-b| and MaxRel the largest |a-b| / max(|a|, |b|) over the
	// elements (0 where both are 0; +Inf where exactly one is NaN or the values are of
	// different infinities).
	MaxAbs float64
	MaxRel float64
}

// Comparable reports whether the tensor is in both checkpoints with the same shape.
func (d TensorDiff) Comparable() bool {
	return d.InA && d.InB && slices.Equal(d.ShapeA, d.ShapeB)
}

// Within reports whether the tensor is in both with the same shape and every element's
// relative difference is at most rtol.
func (d TensorDiff) Within(rtol float64) bool { return d.Comparable() && d.MaxRel <= rtol }

// Diff compares every tensor of a and b element by element, reading (and verifying) both in
// windows, and returns one TensorDiff per tensor name: a's order first, then those only in b.
// A checksum failure is returned as an error; ctx is checked between windows.
func Diff(ctx context.Context, a, b *Checkpoint) ([]TensorDiff, error) {
	var out []TensorDiff
	for _, ta := range a.m.Tensors {
		d := TensorDiff{Name: ta.Name, InA: true, ShapeA: ta.Shape}
		if tb, ok := b.tensors[ta.Name]; ok {
			d.InB, d.ShapeB = true, tb.Shape
		}
		if d.Comparable() {
			if err := diffTensor(ctx, a, b, &d, ta.Elements()); err != nil {
				return nil, err
			}
		}
		out = append(out, d)
	}
	for _, tb := range b.m.Tensors {
		if _, ok := a.tensors[tb.Name]; !ok {
			out = append(out, TensorDiff{Name: tb.Name, InB: true, ShapeB: tb.Shape})
		}
	}
	return out, nil
}

func diffTensor(ctx context.Context, a, b *Checkpoint, d *TensorDiff, n int64) error {
	bufA := make([]float32, min(n, diffWindow))
	bufB := make([]float32, len(bufA))
	for off := int64(0); off < n; off += diffWindow {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("checkpoint: diff: %w", err)
		}
		k := min(n-off, diffWindow)
		if err := a.Read(d.Name, off, bufA[:k]); err != nil {
			return fmt.Errorf("checkpoint: diff %s: %w", a.dir, err)
		}
		if err := b.Read(d.Name, off, bufB[:k]); err != nil {
			return fmt.Errorf("checkpoint: diff %s: %w", b.dir, err)
		}
		for i := range k {
			abs, rel := elementDiff(float64(bufA[i]), float64(bufB[i]))
			d.MaxAbs = max(d.MaxAbs, abs)
			d.MaxRel = max(d.MaxRel, rel)
		}
	}
	return nil
}

// elementDiff returns the absolute and relative difference of x and y; equal values (NaN
// included) differ by 0.
func elementDiff(x, y float64) (abs, rel float64) {
	if x == y || (math.IsNaN(x) && math.IsNaN(y)) {
		return 0, 0
	}
	abs = math.Abs(x - y)
	if math.IsNaN(abs) || math.IsInf(abs, 1) { // one NaN, or an infinity against anything else
		return math.Inf(1), math.Inf(1)
	}
	return abs, abs / max(math.Abs(x), math.Abs(y))
}
