package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/trainer/kernels"
	"github.com/stretchr/testify/require"
)

// benchDims are the attention sizes of the issue-13 bench model: micro-batch 16, 4 heads of
// 32, context 128.
var benchDims = dims{b: 16, t: 128, d: 128, h: 4, hd: 32, n: 16 * 128}

// attnBuffers are the inputs, outputs and scratch of one attention forward and backward.
type attnBuffers struct {
	q, k, v, dy, y, att, dp, dq, dk, dv []float32
}

func newAttnBuffers(dm dims, seed uint64) *attnBuffers {
	rng := rand.New(rand.NewPCG(seed, 1))
	rnd := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(rng.NormFloat64())
		}
		return s
	}
	bht := dm.b * dm.h * dm.t
	return &attnBuffers{
		q: rnd(dm.n * dm.d), k: rnd(dm.n * dm.d), v: rnd(dm.n * dm.d), dy: rnd(dm.n * dm.d),
		y: make([]float32, dm.n*dm.d), att: make([]float32, bht*dm.t), dp: make([]float32, bht*dm.t),
		dq: make([]float32, dm.n*dm.d), dk: make([]float32, dm.n*dm.d), dv: make([]float32, dm.n*dm.d),
	}
}

func newTestPool(threads int) pool {
	eng := kernels.New(threads)
	return pool{threads: threads, team: eng, eng: eng.WithThreads(1)}
}

func (a *attnBuffers) run(p pool, dm dims) {
	attentionForward(p, a.y, a.att, a.q, a.k, a.v, dm)
	attentionBackward(p, a.dq, a.dk, a.dv, a.dp, a.dy, a.att, a.q, a.k, a.v, dm)
}

// referenceAttention is causal attention and its backward for one (sequence, head) pair as
// plain float64 loops over [t, hd] matrices: the reference the pool's version is held to.
func referenceAttention(q, k, v, dy []float32, t, hd int) (y, dq, dk, dv []float64) {
	s := 1 / math.Sqrt(float64(hd))
	p := make([][]float64, t)
	y, dq, dk, dv = make([]float64, t*hd), make([]float64, t*hd), make([]float64, t*hd), make([]float64, t*hd)
	for i := range t {
		p[i] = make([]float64, i+1)
		mx := math.Inf(-1)
		for j := range i + 1 {
			var dot float64
			for c := range hd {
				dot += float64(q[i*hd+c]) * float64(k[j*hd+c])
			}
			p[i][j] = s * dot
			mx = max(mx, p[i][j])
		}
		var sum float64
		for j := range p[i] {
			p[i][j] = math.Exp(p[i][j] - mx)
			sum += p[i][j]
		}
		for j := range p[i] {
			p[i][j] /= sum
			for c := range hd {
				y[i*hd+c] += p[i][j] * float64(v[j*hd+c])
			}
		}
	}
	for i := range t {
		dP := make([]float64, i+1)
		var dot float64
		for j := range i + 1 {
			for c := range hd {
				dP[j] += float64(dy[i*hd+c]) * float64(v[j*hd+c])
				dv[j*hd+c] += p[i][j] * float64(dy[i*hd+c])
			}
			dot += p[i][j] * dP[j]
		}
		for j := range i + 1 {
			dS := s * p[i][j] * (dP[j] - dot)
			for c := range hd {
				dq[i*hd+c] += dS * float64(k[j*hd+c])
				dk[j*hd+c] += dS * float64(q[i*hd+c])
			}
		}
	}
	return y, dq, dk, dv
}

// TestAttentionMatchesReference holds the forward and backward of every (sequence, head) pair
// to the float64 reference, on sizes that do and do not fill the row blocks and the
// micro-kernel's tiles.
func TestAttentionMatchesReference(t *testing.T) {
	for _, tc := range []struct{ b, h, t, hd int }{
		{1, 1, 1, 1}, {1, 2, 5, 3}, {2, 1, 31, 8}, {1, 2, 33, 16}, {2, 2, 64, 32},
		{1, 1, 100, 24}, {1, 2, 128, 32}, {1, 1, 130, 12}, {1, 1, 200, 64},
	} {
		t.Run(fmt.Sprintf("b%d_h%d_t%d_hd%d", tc.b, tc.h, tc.t, tc.hd), func(t *testing.T) {
			dm := dims{b: tc.b, t: tc.t, h: tc.h, hd: tc.hd, d: tc.h * tc.hd, n: tc.b * tc.t}
			a := newAttnBuffers(dm, 7)
			a.run(newTestPool(2), dm)
			m := tc.t * tc.hd
			for i := range tc.b * tc.h {
				sl := func(x []float32) []float32 { return x[i*m : (i+1)*m] }
				y, dq, dk, dv := referenceAttention(sl(a.q), sl(a.k), sl(a.v), sl(a.dy), tc.t, tc.hd)
				for _, c := range []struct {
					name string
					got  []float32
					want []float64
				}{{"y", sl(a.y), y}, {"dq", sl(a.dq), dq}, {"dk", sl(a.dk), dk}, {"dv", sl(a.dv), dv}} {
					for j, w := range c.want {
						require.InDelta(t, w, float64(c.got[j]), 2e-4*(1+math.Abs(w)), "%s pair %d element %d", c.name, i, j)
					}
				}
			}
		})
	}
}

// TestAttentionThreadsSameBits checks that attention's results are the same bits on any
// number of threads.
func TestAttentionThreadsSameBits(t *testing.T) {
	dm := dims{b: 3, t: 77, h: 2, hd: 16, d: 32, n: 3 * 77}
	one := newAttnBuffers(dm, 3)
	one.run(newTestPool(1), dm)
	for _, threads := range []int{2, 3} {
		other := newAttnBuffers(dm, 3)
		other.run(newTestPool(threads), dm)
		require.Equal(t, one, other, "threads=%d", threads)
	}
}

// BenchmarkAttention times attention's forward and backward (without the head copies) on the
// bench model's sizes, on 1 and 2 threads.
func BenchmarkAttention(b *testing.B) {
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			a, p := newAttnBuffers(benchDims, 1), newTestPool(threads)
			for b.Loop() {
				a.run(p, benchDims)
			}
		})
	}
}

// BenchmarkHeadCopies times the copies into and out of the per-head layout a layer's
// attention does, on the bench model's sizes.
func BenchmarkHeadCopies(b *testing.B) {
	dm, p := benchDims, newTestPool(2)
	qkv, heads, out := make([]float32, dm.n*3*dm.d), make([]float32, dm.n*dm.d), make([]float32, dm.n*dm.d)
	for b.Loop() {
		for off := 0; off < 3*dm.d; off += dm.d {
			toHeads(p, heads, qkv, 3*dm.d, off, dm)
		}
		fromHeads(p, out, heads, dm.d, 0, dm)
		toHeads(p, heads, out, dm.d, 0, dm)
		for off := 0; off < 3*dm.d; off += dm.d {
			fromHeads(p, qkv, heads, 3*dm.d, off, dm)
		}
	}
}
