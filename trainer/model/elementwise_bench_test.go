package model

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/trainer/kernels"
)

// BenchmarkElementwise times each row-wise operation of a step at the bench model's sizes
// (16 sequences of 128, d = 128, vocab 256) on 1 and 2 threads; a step runs each of them as
// many times as the model's layers say (see Forward and Backward).
func BenchmarkElementwise(b *testing.B) {
	const n, d, v, t = 2048, 128, 256, 128
	r := rand.New(rand.NewPCG(1, 2))
	f := func(size int) []float32 {
		s := make([]float32, size)
		for i := range s {
			s[i] = r.Float32()*2 - 1
		}
		return s
	}
	tokens := make([]byte, n)
	for i := range tokens {
		tokens[i] = byte(r.IntN(v))
	}
	x, out, dx, dout := f(n*d), f(n*d), f(n*d), f(n*d)
	mean, rstd, w, bias, dw, db := f(n), f(n), f(d), f(d), f(d), f(d)
	for i := range rstd {
		rstd[i] = 1 + rstd[i]*0.5
	}
	h, th, g4 := f(n*4*d), f(n*4*d), f(n*4*d)
	logits, dlogits := f(n*v), f(n*v)
	rowLoss := make([]float64, n)
	wte, wpe := f(v*d), f(t*d)
	gb := f(4 * d)
	for _, threads := range []int{1, 2} {
		eng := kernels.New(threads)
		m := &Model{par: pool{threads: threads, team: eng, eng: eng.WithThreads(1)}, part: make([]float32, 32*4*d)}
		p := pool{threads: threads, team: eng, eng: eng.WithThreads(1)}
		cases := []struct {
			name string
			fn   func()
		}{
			{"embedForward", func() { embedForward(p, out, wte, wpe, tokens, t, d) }},
			{"embedBackward", func() { embedBackward(p, wte, wpe, dx, tokens, t, d) }},
			{"layerNormForward", func() { addLayerNorm(p, normActs{out, mean, rstd}, x, nil, w, bias, n, d) }},
			{"addLayerNorm", func() { addLayerNorm(p, normActs{out, mean, rstd}, x, dx, w, bias, n, d) }},
			{"layerNormBackward", func() { layerNormBackward(p, m.part, dx, dw, db, dout, x, mean, rstd, w, n, d, false) }},
			{"geluForward", func() { geluForward(p, g4, th, h) }},
			{"geluBackward", func() { geluBackward(p, m.part, g4, th, n, 4*d) }},
			{"crossEntropyForward", func() { crossEntropyForward(p, logits, rowLoss, tokens, n, v) }},
			{"crossEntropyBackward", func() { crossEntropyBackward(p, dlogits, logits, tokens, n, v, 1) }},
			{"biasSum/d", func() { m.biasGrad(gb[:d], dout, n, d) }},
			{"biasSum/3d", func() { m.biasGrad(gb[:3*d], g4[:n*3*d], n, 3*d) }},
			{"biasSum/4d", func() { m.biasGrad(gb, g4, n, 4*d) }},
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("%s/threads=%d", c.name, threads), func(b *testing.B) {
				for b.Loop() {
					c.fn()
				}
			})
		}
	}
}
