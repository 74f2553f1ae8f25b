package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// compareWindow is how many elements of each tensor Compare holds at a time.
const compareWindow = 1 << 20

// Tolerance says when the tensors of a checkpoint A equal those of a reference B. Element by
// element it is numpy.allclose's test, |a-b| <= ATol + RTol*|b|, except that NaN equals NaN; the
// zero Tolerance asks for bit-equal values. With Norm each tensor, and each group of tensors
// (see TensorGroup), is taken as one vector instead: ||a-b|| <= ATol + RTol*||b||, in L2 norms,
// the measure that stays meaningful across world sizes, where some values are float noise
// around zero (the attention key bias, whose true gradient is 0), and A is close to B when every
// group is.
type Tolerance struct {
	RTol float64
	ATol float64
	Norm bool
}

// Validate rejects a negative or NaN tolerance.
func (t Tolerance) Validate() error {
	if !(t.RTol >= 0) || !(t.ATol >= 0) {
		return fmt.Errorf("checkpoint: tolerance rtol %v, atol %v: each must be 0 or more", t.RTol, t.ATol)
	}
	return nil
}

// String is e.g. "rtol 1e-05, atol 0, L2 norm per group".
func (t Tolerance) String() string {
	s := fmt.Sprintf("rtol %g, atol %g", t.RTol, t.ATol)
	if t.Norm {
		s += ", L2 norm per group"
	}
	return s
}

// within is the test of both modes: diff <= atol + rtol*ref.
func (t Tolerance) within(diff, ref float64) bool { return diff <= t.ATol+t.RTol*ref }

// TensorGroup is the group a tensor's name puts it in: "optim.<slot>" for optimizer state saved
// as "optim.<slot>.<parameter>" (the AdamW moments "optim.m" and "optim.v"), "params" for every
// other tensor.
func TensorGroup(name string) string {
	if rest, ok := strings.CutPrefix(name, "optim."); ok {
		if slot, _, ok := strings.Cut(rest, "."); ok {
			return "optim." + slot
		}
	}
	return "params"
}

// TensorReport compares one tensor of A and B.
type TensorReport struct {
	Name   string
	Group  string // see TensorGroup
	InA    bool
	InB    bool
	ShapeA []int64
	ShapeB []int64
	// MaxAbs is the largest |a-b| and MaxRel the largest |a-b|/|b| over the elements: 0 where
	// the values are equal (NaN equals NaN), +Inf where exactly one is NaN or the values are
	// different infinities, and MaxRel +Inf where b is 0 and a is not.
	MaxAbs float64
	MaxRel float64
	// NotClose counts the elements outside the element-wise tolerance.
	NotClose int64
	// DiffNorm is ||a-b|| and RefNorm ||b|| (L2; a non-finite b counts 0 in RefNorm).
	DiffNorm float64
	RefNorm  float64
	// Close: the tensor is in both with the same shape and within the tolerance.
	Close bool
}

// Comparable reports whether the tensor is in both checkpoints with the same shape.
func (r TensorReport) Comparable() bool {
	return r.InA && r.InB && slices.Equal(r.ShapeA, r.ShapeB)
}

// NormRel is ||a-b|| / ||b||: 0 when both norms are 0, +Inf when only ||b|| is.
func (r TensorReport) NormRel() float64 { return normRel(r.DiffNorm, r.RefNorm) }

// GroupReport compares the tensors of one group, taken together as one vector.
type GroupReport struct {
	Name     string
	Tensors  int
	DiffNorm float64 // ||a-b|| over the group's comparable tensors
	RefNorm  float64 // ||b|| over the same
	// Close: every tensor of the group is comparable and, with Norm, the group's norms are
	// within the tolerance, else every tensor is Close.
	Close bool
}

// NormRel is ||a-b|| / ||b|| over the group: 0 when both norms are 0, +Inf when only ||b|| is.
func (g GroupReport) NormRel() float64 { return normRel(g.DiffNorm, g.RefNorm) }

func normRel(diff, ref float64) float64 {
	switch {
	case diff == 0:
		return 0
	case ref == 0:
		return math.Inf(1)
	}
	return diff / ref
}

// Report is the outcome of Compare.
type Report struct {
	Tolerance Tolerance
	// Tensors has one entry per tensor name: A's order first, then those only in B.
	Tensors []TensorReport
	// Groups has one entry per TensorGroup, in the order of their first tensor.
	Groups []GroupReport
}

// Differ is the number of tensors that are not Close.
func (r *Report) Differ() int {
	n := 0
	for _, t := range r.Tensors {
		if !t.Close {
			n++
		}
	}
	return n
}

// GroupsDiffer is the number of groups that are not Close.
func (r *Report) GroupsDiffer() int {
	n := 0
	for _, g := range r.Groups {
		if !g.Close {
			n++
		}
	}
	return n
}

// Close reports whether A is close to B: every tensor is Close, or with Norm every group.
func (r *Report) Close() bool {
	if r.Tolerance.Norm {
		return r.GroupsDiffer() == 0
	}
	return r.Differ() == 0
}

// Group returns the report of the named group, and false if no tensor is in it.
func (r *Report) Group(name string) (GroupReport, bool) {
	for _, g := range r.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return GroupReport{}, false
}

// Compare compares every tensor of A with the reference B under tol, reading (and verifying)
// both in windows. It fails on an invalid tol, on a checksum or read error, and with ctx's
// error when ctx ends (checked between windows); tensors missing from one side or of different
// shapes are reported, not errors.
func Compare(ctx context.Context, a, b *Checkpoint, tol Tolerance) (*Report, error) {
	if err := tol.Validate(); err != nil {
		return nil, err
	}
	r := &Report{Tolerance: tol}
	for _, ta := range a.m.Tensors {
		t := TensorReport{Name: ta.Name, Group: TensorGroup(ta.Name), InA: true, ShapeA: ta.Shape}
		if tb, ok := b.tensors[ta.Name]; ok {
			t.InB, t.ShapeB = true, tb.Shape
		}
		if t.Comparable() {
			if err := compareTensor(ctx, a, b, &t, ta.Elements(), tol); err != nil {
				return nil, err
			}
			t.Close = tol.within(t.DiffNorm, t.RefNorm)
			if !tol.Norm {
				t.Close = t.NotClose == 0
			}
		}
		r.Tensors = append(r.Tensors, t)
	}
	for _, tb := range b.m.Tensors {
		if _, ok := a.tensors[tb.Name]; !ok {
			r.Tensors = append(r.Tensors, TensorReport{Name: tb.Name, Group: TensorGroup(tb.Name), InB: true, ShapeB: tb.Shape})
		}
	}
	r.Groups = groups(r.Tensors, tol)
	return r, nil
}

// CompareDirs is Compare of the checkpoints that a and b name: each a step directory, or a
// checkpoint directory standing for its newest complete checkpoint (see Resolve).
func CompareDirs(ctx context.Context, a, b string, tol Tolerance) (_ *Report, err error) {
	var cks [2]*Checkpoint
	for i, p := range []string{a, b} {
		dir, err := Resolve(p)
		if err != nil {
			return nil, err
		}
		if cks[i], err = Open(dir); err != nil {
			return nil, fmt.Errorf("checkpoint: compare %s: %w", dir, err)
		}
		defer func() { err = errors.Join(err, cks[i].Close()) }()
	}
	return Compare(ctx, cks[0], cks[1], tol)
}

func groups(tensors []TensorReport, tol Tolerance) []GroupReport {
	var out []GroupReport
	index := map[string]int{}
	sq := map[string][2]float64{}
	for _, t := range tensors {
		i, ok := index[t.Group]
		if !ok {
			i = len(out)
			index[t.Group] = i
			out = append(out, GroupReport{Name: t.Group, Close: true})
		}
		g := &out[i]
		g.Tensors++
		g.Close = g.Close && t.Comparable() && (tol.Norm || t.Close)
		s := sq[t.Group]
		sq[t.Group] = [2]float64{s[0] + t.DiffNorm*t.DiffNorm, s[1] + t.RefNorm*t.RefNorm}
	}
	for i := range out {
		g := &out[i]
		s := sq[g.Name]
		g.DiffNorm, g.RefNorm = math.Sqrt(s[0]), math.Sqrt(s[1])
		if tol.Norm {
			g.Close = g.Close && tol.within(g.DiffNorm, g.RefNorm)
		}
	}
	return out
}

// compareTensor fills t's differences, count of elements outside tol and norms from the n
// elements of tensor t.Name.
func compareTensor(ctx context.Context, a, b *Checkpoint, t *TensorReport, n int64, tol Tolerance) error {
	bufA := make([]float32, min(n, compareWindow))
	bufB := make([]float32, len(bufA))
	var diff2, ref2 float64
	for off := int64(0); off < n; off += compareWindow {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("checkpoint: compare: %w", err)
		}
		k := min(n-off, compareWindow)
		if err := a.Read(t.Name, off, bufA[:k]); err != nil {
			return fmt.Errorf("checkpoint: compare %s: %w", a.dir, err)
		}
		if err := b.Read(t.Name, off, bufB[:k]); err != nil {
			return fmt.Errorf("checkpoint: compare %s: %w", b.dir, err)
		}
		for i := range k {
			x, y := float64(bufA[i]), float64(bufB[i])
			abs, rel := elementDiff(x, y)
			t.MaxAbs = max(t.MaxAbs, abs)
			t.MaxRel = max(t.MaxRel, rel)
			if abs != 0 && !tol.within(abs, math.Abs(y)) {
				t.NotClose++
			}
			diff2 += abs * abs
			if !math.IsInf(y, 0) && !math.IsNaN(y) {
				ref2 += y * y
			}
		}
	}
	t.DiffNorm, t.RefNorm = math.Sqrt(diff2), math.Sqrt(ref2)
	return nil
}

// elementDiff returns |x-y| and |x-y|/|y|; equal values (NaN included) differ by 0.
func elementDiff(x, y float64) (abs, rel float64) {
	if x == y || (math.IsNaN(x) && math.IsNaN(y)) {
		return 0, 0
	}
	abs = math.Abs(x - y)
	if math.IsNaN(abs) || math.IsInf(abs, 1) { // one NaN, or an infinity against anything else
		return math.Inf(1), math.Inf(1)
	}
	return abs, abs / math.Abs(y) // +Inf when y is 0
}
