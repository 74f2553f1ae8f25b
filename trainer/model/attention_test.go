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

// attnBuffers are the inputs, outputs and scratch of one attention forward and backward, in
// the layouts of the linear layers around it: qkv and its gradient [n, 3d], y and dy [n, d].
type attnBuffers struct {
	qkv, dy, y, att, dp, dqkv []float32
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
		qkv: rnd(dm.n * 3 * dm.d), dy: rnd(dm.n * dm.d),
		y: make([]float32, dm.n*dm.d), att: make([]float32, bht*dm.t), dp: make([]float32, bht*dm.t),
		dqkv: make([]float32, dm.n*3*dm.d),
	}
}

func newTestPool(threads int) pool {
	eng := kernels.New(threads)
	return pool{threads: threads, team: eng, eng: eng.WithThreads(1)}
}

func (a *attnBuffers) run(p pool, dm dims) {
	attentionForward(p, a.y, a.att, a.qkv, dm)
	attentionBackward(p, a.dqkv, a.dp, a.dy, a.att, a.qkv, dm)
}

// headOf copies head hi of sequence bi out of x ([n, stride], heads' columns from off) into
// a contiguous [t, hd] matrix.
func headOf(x []float32, stride, off, bi, hi int, dm dims) []float32 {
	h := make([]float32, dm.t*dm.hd)
	for ti := range dm.t {
		copy(h[ti*dm.hd:][:dm.hd], x[(bi*dm.t+ti)*stride+off+hi*dm.hd:][:dm.hd])
	}
	return h
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
			for i := range tc.b * tc.h {
				bi, hi, d := i/tc.h, i%tc.h, dm.d
				qkv := func(off int) []float32 { return headOf(a.qkv, 3*d, off, bi, hi, dm) }
				dqkv := func(off int) []float32 { return headOf(a.dqkv, 3*d, off, bi, hi, dm) }
				y, dq, dk, dv := referenceAttention(qkv(0), qkv(d), qkv(2*d), headOf(a.dy, d, 0, bi, hi, dm), tc.t, tc.hd)
				for _, c := range []struct {
					name string
					got  []float32
					want []float64
				}{{"y", headOf(a.y, d, 0, bi, hi, dm), y}, {"dq", dqkv(0), dq}, {"dk", dqkv(d), dk}, {"dv", dqkv(2 * d), dv}} {
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

// BenchmarkAttention times attention's forward and backward on the bench model's sizes, on 1
// and 2 threads.
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
