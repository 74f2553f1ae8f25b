package model

import "math"

// The MLP of a block is c_fc (d -> 4d), GELU, c_proj (4d -> d); its two linear layers use
// linearForward and linearBackward, and this file holds the activation.

// geluC is sqrt(2/pi), the constant of GELU's tanh approximation.
const geluC = 0.7978845608028654

// geluForward computes out = gelu(h) elementwise with the tanh approximation GPT-2 uses:
// gelu(h) = 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h³))).
func geluForward(out, h []float32) {
	for i, v := range h {
		x := float64(v)
		out[i] = float32(0.5 * x * (1 + math.Tanh(geluC*(x+0.044715*x*x*x))))
	}
}

// geluBackward multiplies g (dL/dout on entry, dL/dh on return) by gelu'(h):
// with u = sqrt(2/pi) (h + 0.044715 h³) and t = tanh(u),
// gelu'(h) = 0.5 (1 + t) + 0.5 h (1 - t²) sqrt(2/pi) (1 + 3·0.044715 h²).
func geluBackward(g, h []float32) {
	for i, v := range h {
		x := float64(v)
		t := math.Tanh(geluC * (x + 0.044715*x*x*x))
		dg := 0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*0.044715*x*x)
		g[i] = float32(float64(g[i]) * dg)
	}
}
