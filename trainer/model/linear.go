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
// gb. It laps prof after the products (GEMM) and after the bias gradient (elementwise).
func linearBackward(eng *kernels.Engine, prof *profile.Timer, gin, gw, gb, g, in, w []float32, n, din, dout int) {
	eng.MatMul(gin, g, w, n, din, dout, false, false, false)
	eng.MatMul(gw, g, in, dout, din, n, true, false, true)
	prof.Lap(profile.GEMM)
	for i := 0; i < n; i++ {
		row := g[i*dout : (i+1)*dout]
		for j, v := range row {
			gb[j] += v
		}
	}
	prof.Lap(profile.Elementwise)
}
