package model

import "math"

// expf is exp(x) in float32, within 2e-7 relative of math.Exp over [-87, 88]: exp(x) =
// 2^k · exp(r) with k = round(x/ln 2) and |r| <= ln(2)/2, exp(r) by its degree-7 Taylor
// polynomial. Below -87 it returns 0 (the softmax uses it on x - max <= 0, where such terms do
// not count); above 88 it returns +Inf. It is several times faster than math.Exp, which
// matters because the softmaxes and GELU call it once per element.
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693145751953125 // ln 2 split so that k*ln2hi is exact in float32
		ln2lo = 1.42860682030941723212e-6
	)
	if x < -87 {
		return 0
	}
	if x > 88 {
		return float32(math.Inf(1))
	}
	// Adding and subtracting 1.5·2^23 rounds to the nearest integer in float32 (Go does not
	// reassociate floating-point sums), without a call to math.Floor.
	const round = 12582912
	k := (x*log2e + round) - round
	r := x - k*ln2hi - k*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}

// tanhf is tanh(x) in float32 from expf, within 1e-6 absolute: tanh(x) = 1 - 2/(exp(2x)+1),
// saturating to ±1 where exp(2x) leaves float32's range.
func tanhf(x float32) float32 {
	if x > 40 {
		return 1
	}
	if x < -40 {
		return -1
	}
	return 1 - 2/(expf(2*x)+1)
}
