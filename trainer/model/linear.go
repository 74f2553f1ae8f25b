package model

import (
	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/profile"
)

// linearForward computes out = in·wᵀ + b for n rows: in is [n, din], w is [dout, din] like
// torch.nn.Linear, b is [dout], out is [n, dout]. The bias goes into each block of out just before
// the product adds to it (MatMulBias), on the goroutine that computes the block, while the block is
// in its cache.
func linearForward(eng *kernels.Engine, out, in, w, b []float32, n, din, dout int) {
	eng.MatMulBias(out, in, w, b, n, dout, din, false, true)
}

// linearBackward takes g = dL/dout ([n, dout]) and writes dL/din = g·w into gin, and adds the
// parameter gradients dL/dw = gᵀ·in ([dout, din]) into gw and dL/db = the column sums of g into
// gb (see biasGrad). It laps m.prof after the weight products (GEMM) and after the bias gradient
// (elementwise).
func (m *Model) linearBackward(gin, gw, gb, g, in, w []float32, n, din, dout int) {
	m.linearProducts(gin, gw, g, in, w, n, din, dout)
	m.biasGrad(gb, g, n, dout)
	m.prof.Lap(profile.Elementwise)
}

// linearProducts is linearBackward without the bias: gin = g·w and gw += gᵀ·in. It laps m.prof
// (GEMM).
func (m *Model) linearProducts(gin, gw, g, in, w []float32, n, din, dout int) {
	m.eng.MatMul(gin, g, w, n, din, dout, false, false, false)
	m.eng.MatMul(gw, g, in, dout, din, n, true, false, true)
	m.prof.Lap(profile.GEMM)
}

// biasGrad adds the column sums of g ([n, dout]) into gb: each chunk of rowChunk rows sums its
// columns into its own partial sums in m.part, in parallel on m.par, and the partial sums are
// added to gb in chunk order, so the bits do not depend on the thread count. The sums are fp32
// whatever the precision of the products.
func (m *Model) biasGrad(gb, g []float32, n, dout int) {
	m.par.forEach(chunks(n), func(i int) { chunkSum(m.par.eng, m.part, g, i, n, dout) })
	m.par.eng.SumRows(gb, m.part[:chunks(n)*dout], dout)
}
