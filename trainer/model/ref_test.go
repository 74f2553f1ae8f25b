package model

import (
	"fmt"
	"math"
)

// refLoss is an independent float64 implementation of the model's loss, written with plain
// loops and no shared code, so gradient checks compare Backward against finite differences of
// a different program.
func refLoss(cfg Config, p []float64, tokens []byte, batch int) float64 {
	l := NewLayout(cfg)
	tensors := map[string][]float64{}
	for _, t := range l.Tensors {
		tensors[t.Name] = p[t.Offset : t.Offset+t.Len()]
	}
	get := func(name string) []float64 {
		t, ok := tensors[name]
		if !ok {
			panic("no tensor " + name)
		}
		return t
	}
	T, D, H, V := cfg.Context, cfg.DModel, cfg.Heads, cfg.Vocab
	hd := D / H
	norm := func(x, w, b []float64) []float64 {
		var mu, v float64
		for _, a := range x {
			mu += a
		}
		mu /= float64(len(x))
		for _, a := range x {
			v += (a - mu) * (a - mu)
		}
		v /= float64(len(x))
		out := make([]float64, len(x))
		for i, a := range x {
			out[i] = (a-mu)/math.Sqrt(v+1e-5)*w[i] + b[i]
		}
		return out
	}
	// linear: y[o] = sum_i W[o][i] x[i] + b[o], W stored [out][in].
	linear := func(x, w, b []float64, out int) []float64 {
		y := make([]float64, out)
		for o := range y {
			s := b[o]
			for i, a := range x {
				s += w[o*len(x)+i] * a
			}
			y[o] = s
		}
		return y
	}
	wte, wpe := get("wte.weight"), get("wpe.weight")
	var total float64
	for s := 0; s < batch; s++ {
		seq := tokens[s*(T+1) : (s+1)*(T+1)]
		x := make([][]float64, T)
		for t := 0; t < T; t++ {
			x[t] = make([]float64, D)
			for j := range x[t] {
				x[t][j] = wte[int(seq[t])*D+j] + wpe[t*D+j]
			}
		}
		for layer := 0; layer < cfg.Layers; layer++ {
			pre := fmt.Sprintf("h.%d.", layer)
			q, k, v := make([][]float64, T), make([][]float64, T), make([][]float64, T)
			for t := 0; t < T; t++ {
				qkv := linear(norm(x[t], get(pre+"ln_1.weight"), get(pre+"ln_1.bias")),
					get(pre+"attn.c_attn.weight"), get(pre+"attn.c_attn.bias"), 3*D)
				q[t], k[t], v[t] = qkv[:D], qkv[D:2*D], qkv[2*D:]
			}
			for t := 0; t < T; t++ {
				y := make([]float64, D)
				for h := 0; h < H; h++ {
					sc := make([]float64, t+1)
					mx := math.Inf(-1)
					for u := 0; u <= t; u++ {
						for e := 0; e < hd; e++ {
							sc[u] += q[t][h*hd+e] * k[u][h*hd+e]
						}
						sc[u] /= math.Sqrt(float64(hd))
						mx = math.Max(mx, sc[u])
					}
					var z float64
					for u := range sc {
						sc[u] = math.Exp(sc[u] - mx)
						z += sc[u]
					}
					for u := range sc {
						for e := 0; e < hd; e++ {
							y[h*hd+e] += sc[u] / z * v[u][h*hd+e]
						}
					}
				}
				a := linear(y, get(pre+"attn.c_proj.weight"), get(pre+"attn.c_proj.bias"), D)
				for j := range a {
					a[j] += x[t][j]
				}
				x[t] = a // positions after t are still read as k, v from the saved q, k, v
			}
			for t := 0; t < T; t++ {
				f := linear(norm(x[t], get(pre+"ln_2.weight"), get(pre+"ln_2.bias")),
					get(pre+"mlp.c_fc.weight"), get(pre+"mlp.c_fc.bias"), 4*D)
				for j, h := range f {
					f[j] = 0.5 * h * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(h+0.044715*h*h*h)))
				}
				m := linear(f, get(pre+"mlp.c_proj.weight"), get(pre+"mlp.c_proj.bias"), D)
				for j := range m {
					x[t][j] += m[j]
				}
			}
		}
		for t := 0; t < T; t++ {
			xf := norm(x[t], get("ln_f.weight"), get("ln_f.bias"))
			logits := make([]float64, V)
			mx := math.Inf(-1)
			for c := range logits {
				for j := 0; j < D; j++ {
					logits[c] += xf[j] * wte[c*D+j]
				}
				mx = math.Max(mx, logits[c])
			}
			var z float64
			for _, lg := range logits {
				z += math.Exp(lg - mx)
			}
			total += -(logits[seq[t+1]] - mx - math.Log(z))
		}
	}
	return total / float64(batch*T)
}
