package resume

import (
	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/recovery"
)

// Prefixes of the AdamW moments' tensor names: the first moment of "wte.weight" is saved as
// "optim.m.wte.weight", the second as "optim.v.wte.weight". Parameters keep the model's names.
const (
	PrefixM = "optim.m."
	PrefixV = "optim.v."
)

// piece is the overlap of a rank's slice [lo, hi) of the padded flat buffer with one tensor.
type piece struct {
	info   model.TensorInfo
	offset int64 // first element of the overlap within the tensor
	lo, hi int   // the overlap as indices into the rank's slice
}

// overlaps maps the slice [lo, hi) of a padded flat buffer laid out by l onto the tensors it
// overlaps, in layout order; the padding past l.Size belongs to no tensor.
func overlaps(l model.Layout, lo, hi int) []piece {
	var out []piece
	for _, ti := range l.Tensors {
		a, b := max(lo, ti.Offset), min(hi, ti.Offset+ti.Len())
		if a < b {
			out = append(out, piece{info: ti, offset: int64(a - ti.Offset), lo: a - lo, hi: b - lo})
		}
	}
	return out
}

func shape(ti model.TensorInfo) []int64 {
	s := make([]int64, len(ti.Shape))
	for i, d := range ti.Shape {
		s[i] = int64(d)
	}
	return s
}

// Tensors returns the named tensors of a rank's state s for a checkpoint: every tensor of l, its
// parameters under the model's name and its AdamW moments under PrefixM and PrefixV, each with
// its global shape and the part of it that s's slice [Lo, Hi) holds (none for a tensor the slice
// does not overlap: every rank names every tensor, so the manifest lists them in layout order).
// The data alias s's slices.
func Tensors(l model.Layout, s recovery.State) []checkpoint.Tensor {
	ps := overlaps(l, s.Lo, s.Hi)
	out := make([]checkpoint.Tensor, 0, 3*len(l.Tensors))
	for _, src := range []struct {
		prefix string
		data   []float32
	}{{"", s.Params}, {PrefixM, s.M}, {PrefixV, s.V}} {
		k := 0
		for _, ti := range l.Tensors {
			t := checkpoint.Tensor{Name: src.prefix + ti.Name, Shape: shape(ti)}
			if k < len(ps) && ps[k].info.Name == ti.Name {
				t.Offset, t.Data = ps[k].offset, src.data[ps[k].lo:ps[k].hi]
				k++
			}
			out = append(out, t)
		}
	}
	return out
}

// Requests returns the checkpoint requests that fill dst's parameters and moments, the slice
// [dst.Lo, dst.Hi) of the padded flat buffer laid out by l, from the tensors Tensors names,
// whatever layout saved them. Nothing is asked for the padding past the model: dst keeps what it
// holds there (zero, in a trainer's buffers).
func Requests(l model.Layout, dst recovery.Slice) []checkpoint.Request {
	ps := overlaps(l, dst.Lo, dst.Hi)
	out := make([]checkpoint.Request, 0, 3*len(ps))
	for _, d := range []struct {
		prefix string
		data   []float32
	}{{"", dst.Params}, {PrefixM, dst.M}, {PrefixV, dst.V}} {
		for _, p := range ps {
			out = append(out, checkpoint.Request{Name: d.prefix + p.info.Name, Offset: p.offset, Dst: d.data[p.lo:p.hi]})
		}
	}
	return out
}
