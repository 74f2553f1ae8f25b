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
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	residStd := initStd / math.Sqrt(2*float64(cfg.Layers))
	for _, t := range l.Tensors {
		p := params[t.Offset : t.Offset+t.Len()]
		switch {
		case strings.HasSuffix(t.Name, "c_proj.weight"):
			fillNormal(p, rng, residStd)
		case t.Decayed(): // every other matrix and the embeddings
			fillNormal(p, rng, initStd)
		case strings.Contains(t.Name, "ln_") && strings.HasSuffix(t.Name, ".weight"):
			fill(p, 1)
		default: // biases
			fill(p, 0)
		}
	}
}

func fillNormal(p []float32, rng *rand.Rand, std float64) {
	for i := range p {
		p[i] = float32(rng.NormFloat64() * std)
	}
}

func fill(p []float32, v float32) {
	for i := range p {
		p[i] = v
	}
}
