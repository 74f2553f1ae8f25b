package model

import (
	"fmt"

	"github.com/gorun/gorun/trainer/kernels"
)

// TensorInfo names one tensor of the flat parameter buffer: its global shape (row-major) and
// the offset of its first element.
type TensorInfo struct {
	Name   string `json:"name"`
	Shape  []int  `json:"shape"`
	Offset int    `json:"offset"`
}

// Len is the number of elements of the tensor.
func (t TensorInfo) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Layout places every parameter tensor in one flat buffer, back to back with no gaps, in the
// order of Tensors. Grads, and the AdamW moments, use the same layout. Size is the number of
// elements the model reads; a sharded buffer may be longer (padding), and the model never reads
// or writes past Size.
type Layout struct {
	Tensors []TensorInfo
	Size    int
}

// Tensor names follow nanoGPT's state dict without its "transformer." prefix, and matrices are
// stored [out, in] like torch.nn.Linear, so a checkpoint maps onto a PyTorch GPT by name.
const (
	nameWTE = "wte.weight" // [vocab, d]: token embedding, tied with the output projection
	nameWPE = "wpe.weight" // [context, d]: learned position embedding
	nameLNF = "ln_f"       // final layer norm
)

// NewLayout lays out the parameters of cfg: wte, wpe, then per block ln_1, attn.c_attn,
// attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (each .weight then .bias), then ln_f. cfg must have
// passed Validate.
func NewLayout(cfg Config) Layout {
	var l Layout
	add := func(name string, shape ...int) {
		t := TensorInfo{Name: name, Shape: shape, Offset: l.Size}
		l.Tensors = append(l.Tensors, t)
		l.Size += t.Len()
	}
	d := cfg.DModel
	add(nameWTE, cfg.Vocab, d)
	add(nameWPE, cfg.Context, d)
	for i := 0; i < cfg.Layers; i++ {
		p := fmt.Sprintf("h.%d.", i)
		add(p+"ln_1.weight", d)
		add(p+"ln_1.bias", d)
		add(p+"attn.c_attn.weight", 3*d, d)
		add(p+"attn.c_attn.bias", 3*d)
		add(p+"attn.c_proj.weight", d, d)
		add(p+"attn.c_proj.bias", d)
		add(p+"ln_2.weight", d)
		add(p+"ln_2.bias", d)
		add(p+"mlp.c_fc.weight", 4*d, d)
		add(p+"mlp.c_fc.bias", 4*d)
		add(p+"mlp.c_proj.weight", d, 4*d)
		add(p+"mlp.c_proj.bias", d)
	}
	add(nameLNF+".weight", d)
	add(nameLNF+".bias", d)
	return l
}

// Find returns the tensor called name, and false when there is none.
func (l Layout) Find(name string) (TensorInfo, bool) {
	for _, t := range l.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// PaddedSize is Size rounded up to a multiple of shards (at least 1), the length of a flat
// buffer that splits evenly into shards equal slices.
func (l Layout) PaddedSize(shards int) int {
	s := max(shards, 1)
	return (l.Size + s - 1) / s * s
}

// Decayed reports whether AdamW applies weight decay to t: every tensor with two or more
// dimensions (the linear weights and the embeddings), as in nanoGPT; biases and layer-norm
// parameters are not decayed.
func (t TensorInfo) Decayed() bool { return len(t.Shape) >= 2 }

// DecaySpans returns where weight decay applies in the elements [lo, hi) of a flat buffer (a
// padded one included), as spans of those elements counted from lo (the first element of the
// slice is 0), in order: the decayed tensors' elements in the slice. A rank passes the spans
// of the slice it owns to the optimizer (see optim.Update); there are at most as many as
// tensors, whatever the slice's length. Padding past Size is not decayed.
func (l Layout) DecaySpans(lo, hi int) []kernels.Span {
	var spans []kernels.Span
	for _, t := range l.Tensors {
		a, b := max(t.Offset, lo), min(t.Offset+t.Len(), hi)
		if !t.Decayed() || a >= b {
			continue
		}
		if n := len(spans); n > 0 && spans[n-1].Hi == a-lo {
			spans[n-1].Hi = b - lo // adjacent decayed tensors make one span
			continue
		}
		spans = append(spans, kernels.Span{Lo: a - lo, Hi: b - lo})
	}
	return spans
}

// Unit is a contiguous range [Lo, Hi) of the flat buffer that the model reads as one piece:
// the embeddings, a part of a transformer block, or the final layer norm. A sharded trainer
// gathers and frees the parameters, and reduces the gradients, one unit at a time.
type Unit struct {
	Lo, Hi int
}

// Len is the number of elements of the unit.
func (u Unit) Len() int { return u.Hi - u.Lo }

// The parts of a block, each a unit: the tensors a pass uses together, in layout order.
const (
	attnIn  = iota // ln_1 and attn.c_attn: 3d² + 5d elements
	attnOut        // attn.c_proj: d² + d
	mlpIn          // ln_2 and mlp.c_fc: 4d² + 6d
	mlpOut         // mlp.c_proj: 4d² + d
	// partsPerBlock is the number of units of each block.
	partsPerBlock
)

// partTensors is the number of tensors of block part p.
func partTensors(p int) int {
	if p == attnIn || p == mlpIn {
		return 4 // a layer norm's weight and bias, a linear layer's
	}
	return 2
}

// splitBlocksFrom is the parameter count from which Units splits a block into its parts: a
// smaller block is gathered whole, because there the collectives' own cost outweighs the
// memory its parts would save (a block of d_model 296 or more is split).
const splitBlocksFrom = 1 << 20

// Units splits the layout into the units the model reads, in buffer order: unit 0 holds the
// embeddings (wte, wpe); then each block, block by block, as one unit or, from splitBlocksFrom
// parameters a block, as four, its parts: ln_1 with attn.c_attn, attn.c_proj, ln_2 with
// mlp.c_fc, and mlp.c_proj (the longest, about a third of the block); and the last unit ln_f.
// They cover [0, Size) without gaps or overlaps.
func (l Layout) Units() []Unit { return l.units(splitBlocksFrom) }

// units is Units with the blocks of at least splitFrom parameters split into their parts.
func (l Layout) units(splitFrom int) []Unit {
	blocks := (len(l.Tensors) - 4) / tensorsPerBlock
	units := make([]Unit, 0, partsPerBlock*blocks+2)
	add := func(first, count int) {
		a, b := l.Tensors[first], l.Tensors[first+count-1]
		units = append(units, Unit{Lo: a.Offset, Hi: b.Offset + b.Len()})
	}
	add(0, 2)
	for i := range blocks {
		first := 2 + i*tensorsPerBlock
		if l.blockLen() < splitFrom {
			add(first, tensorsPerBlock)
			continue
		}
		for p := range partsPerBlock {
			add(first, partTensors(p))
			first += partTensors(p)
		}
	}
	add(len(l.Tensors)-2, 2)
	return units
}

// blockLen is the number of parameters of one block (0 without blocks).
func (l Layout) blockLen() int {
	if len(l.Tensors) < 4+tensorsPerBlock {
		return 0
	}
	last := l.Tensors[2+tensorsPerBlock-1]
	return last.Offset + last.Len() - l.Tensors[2].Offset
}

// partRange is where part p of a block lies in the block's elements.
func (l Layout) partRange(p int) Unit {
	first := 2
	for q := range p {
		first += partTensors(q)
	}
	a, b := l.Tensors[first], l.Tensors[first+partTensors(p)-1]
	return Unit{Lo: a.Offset - l.Tensors[2].Offset, Hi: b.Offset + b.Len() - l.Tensors[2].Offset}
}

// tensorsPerBlock is the number of tensors NewLayout adds per block.
const tensorsPerBlock = 12

// unitTensors slices buf, the elements of unit u, into the tensors of l that lie in u, in
// layout order.
func (l Layout) unitTensors(u Unit, buf []float32) [][]float32 {
	var out [][]float32
	for _, t := range l.Tensors {
		if t.Offset >= u.Lo && t.Offset < u.Hi {
			a, b := t.Offset-u.Lo, t.Offset-u.Lo+t.Len()
			out = append(out, buf[a:b:b])
		}
	}
	return out
}
