package model

import (
	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/profile"
)

// linearForward computes out = in·wᵀ + b for n rows: in is [n, din], w is [dout, din] like
// torch.nn.Linear, b is [dout], out is [n, dout]. The bias goes in first and the product adds to
// it, which costs a copy per row instead of a pass of scalar additions.
func linearForward(eng *kernels.Engine, out, in, w, b []float32, n, din, dout int) {
	for i := 0; i < n; i++ {
		copy(out[i*dout:(i+1)*dout], b[:dout])
	}
	eng.MatMul(out, in, w, n, dout, din, false, true, true)
}

// linearBackward takes g = dL/dout ([n, dout]) and writes dL/din = g·w into gin, and adds the
// parameter gradients dL/dw = gᵀ·in ([dout, din]) into gw and dL/db = the column sums of g into
// gb. The column sums are a product too, onesᵀ·g with a row of n ones, which runs on the
// engine's vector kernels (2-3x a scalar loop on the bench model's shapes). It laps m.prof after
// the weight products (GEMM) and after the bias gradient (elementwise).
func (m *Model) linearBackward(gin, gw, gb, g, in, w []float32, n, din, dout int) {
	m.eng.MatMul(gin, g, w, n, din, dout, false, false, false)
	m.eng.MatMul(gw, g, in, dout, din, n, true, false, true)
	m.prof.Lap(profile.GEMM)
	m.sum.MatMul(gb, m.ones[:n], g, 1, dout, n, false, false, true)
	m.prof.Lap(profile.Elementwise)
}
