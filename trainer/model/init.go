package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// initStd is GPT-2's standard deviation for every weight matrix and embedding.
const initStd = 0.02

// Init fills params[:NewLayout(cfg).Size] with GPT-2's initialization, drawn from a PCG stream
// seeded by seed, so the same (cfg, seed) gives the same bits on every machine: weights and
// embeddings N(0, 0.02), the two residual projections (attn.c_proj and mlp.c_proj weights)
// N(0, 0.02/sqrt(2*layers)), biases 0, layer-norm gains 1. It leaves padding past Size alone.
// cfg must have passed Validate; it panics when params is shorter than the layout, a bug in the
// caller.
func Init(cfg Config, params []float32, seed uint64) {
	l := NewLayout(cfg)
	if len(params) < l.Size {
		panic(fmt.Sprintf("model: Init with %d params, layout needs %d", len(params), l.Size))
	}
	InitRange(cfg, params[:l.Size], 0, seed)
}

// InitRange fills part with the elements [lo, lo+len(part)) of what Init writes into a whole
// buffer, the same bits, without a buffer of the whole model: a rank that keeps only its slice
// of the parameters initializes that slice. Elements past the layout's Size (padding) are left
// alone. It draws the stream up to the slice's end, so its time grows with lo+len(part).
func InitRange(cfg Config, part []float32, lo int, seed uint64) {
	l := NewLayout(cfg)
	hi := lo + len(part)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	residStd := initStd / math.Sqrt(2*float64(cfg.Layers))
	for _, t := range l.Tensors {
		if t.Offset >= hi {
			break
		}
		a, b := t.Offset, t.Offset+t.Len()
		// The slice of part this tensor covers; outside it, random draws are made and dropped.
		in := func(i int) bool { return i >= lo && i < hi }
		switch {
		case strings.HasSuffix(t.Name, "c_proj.weight"):
			for i := a; i < b; i++ {
				if x := float32(rng.NormFloat64() * residStd); in(i) {
					part[i-lo] = x
				}
			}
		case t.Decayed(): // every other matrix and the embeddings
			for i := a; i < b; i++ {
				if x := float32(rng.NormFloat64() * initStd); in(i) {
					part[i-lo] = x
				}
			}
		case strings.Contains(t.Name, "ln_") && strings.HasSuffix(t.Name, ".weight"):
			fill(part[max(a, lo)-lo:max(min(b, hi), lo)-lo], 1)
		default: // biases
			fill(part[max(a, lo)-lo:max(min(b, hi), lo)-lo], 0)
		}
	}
}

func fill(p []float32, v float32) {
	for i := range p {
		p[i] = v
	}
}
