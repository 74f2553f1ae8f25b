package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// adamwState is one buffer's parameters, moments, gradients and decay
// mask, filled with values of every magnitude AdamW meets and some it
// should not.
type adamwState struct {
	params, m, v, grads []float32
	decay               []bool
}

// wildFloat is a float32 of random sign and a magnitude anywhere from
// subnormal to 1e30, zero now and then.
func wildFloat(r *rand.Rand) float32 {
	if r.IntN(50) == 0 {
		return 0
	}
	x := float32(math.Pow(10, r.Float64()*75-45)) // 1e-45 is subnormal
	if r.IntN(2) == 0 {
		x = -x
	}
	return x
}

func newAdamWState(r *rand.Rand, n int, decay, wild bool) adamwState {
	s := adamwState{params: make([]float32, n), m: make([]float32, n), v: make([]float32, n), grads: make([]float32, n)}
	if decay {
		s.decay = make([]bool, n)
	}
	for i := range n {
		s.params[i], s.grads[i] = r.Float32()*2-1, r.Float32()*2-1
		s.m[i], s.v[i] = (r.Float32()*2-1)*1e-2, r.Float32()*1e-4
		if wild {
			s.params[i], s.grads[i], s.m[i] = wildFloat(r), wildFloat(r), wildFloat(r)
			s.v[i] = float32(math.Abs(float64(wildFloat(r))))
		}
		if decay {
			s.decay[i] = r.IntN(3) != 0
		}
	}
	return s
}

// spansOf is the spans of the runs of true in mask, for Engine.AdamW.
func spansOf(mask []bool) []Span {
	var spans []Span
	for i, d := range mask {
		switch {
		case !d:
		case len(spans) > 0 && spans[len(spans)-1].Hi == i:
			spans[len(spans)-1].Hi++
		default:
			spans = append(spans, Span{i, i + 1})
		}
	}
	return spans
}

func (s adamwState) clone() adamwState {
	c := adamwState{params: append([]float32(nil), s.params...), m: append([]float32(nil), s.m...),
		v: append([]float32(nil), s.v...), grads: append([]float32(nil), s.grads...)}
	if s.decay != nil {
		c.decay = append([]bool(nil), s.decay...)
	}
	return c
}

// requireSameBits checks that got holds want's bits, element by element;
// a NaN matches any NaN (the payload of a NaN made of two NaNs depends on
// operand order, which the compiler picks).
func requireSameBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if want[i] != want[i] && got[i] != got[i] {
			continue
		}
		require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "%s[%d]: want %g, got %g", what, i, want[i], got[i])
	}
}

// adamwSteps are steps of schedules from train.toml and beyond: warmup,
// clipping, no decay, a huge clip and a near-one beta2.
var adamwSteps = []AdamWStep{
	{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Shrink: 1 - 3e-3*0.1, BC1: 1 - 0.9, BC2: 1 - 0.95, Clip: 1},
	{LR: 1.5e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Shrink: 1 - 1.5e-4*0.1, BC1: 1 - math.Pow(0.9, 7), BC2: 1 - math.Pow(0.95, 7), Clip: 0.3721},
	{LR: 1e-2, Beta1: 0.8, Beta2: 0.999, Eps: 1e-6, Shrink: 1, BC1: 1 - math.Pow(0.8, 100), BC2: 1 - math.Pow(0.999, 100), Clip: 1},
	{LR: 0.5, Beta1: 0, Beta2: 0.999999, Eps: 1e-12, Shrink: 0.5, BC1: 1, BC2: 1 - math.Pow(0.999999, 3), Clip: 1e20},
}

// TestAdamWKernelsAgree checks that every AdamW kernel the CPU runs, on
// 1 to 3 threads, gives goAdamW's bits over three steps, with and without
// a decay mask, on ordinary values and on values from subnormal to 1e30.
func TestAdamWKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	lengths := append(append([]int(nil), vecLengths...), 2*adamwChunk+13)
	for _, kern := range kernelsForCPU() {
		for _, threads := range []int{1, 2, 3} {
			e := newEngine(threads, kern)
			for _, n := range lengths {
				for _, decay := range []bool{false, true} {
					for _, wild := range []bool{false, true} {
						name := fmt.Sprintf("%s/threads=%d/n=%d/decay=%v/wild=%v", kern.name, threads, n, decay, wild)
						t.Run(name, func(t *testing.T) {
							want := newAdamWState(r, n, decay, wild)
							got := want.clone()
							for _, s := range adamwSteps[:3] {
								goAdamW(want.params, want.m, want.v, want.grads, want.decay, &s)
								e.AdamW(got.params, got.m, got.v, got.grads, spansOf(got.decay), s)
							}
							s := adamwSteps[3]
							goAdamW(want.params, want.m, want.v, want.grads, want.decay, &s)
							e.AdamW(got.params, got.m, got.v, got.grads, spansOf(got.decay), s)
							requireSameBits(t, want.params, got.params, "params")
							requireSameBits(t, want.m, got.m, "m")
							requireSameBits(t, want.v, got.v, "v")
							requireSameBits(t, want.grads, got.grads, "grads")
						})
					}
				}
			}
		}
	}
}

// TestAdamWSpecialValues checks the kernels against goAdamW on infinite
// and NaN gradients and moments: NaN stays NaN, infinities give what the
// scalar code gives.
func TestAdamWSpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	special := []float32{0, float32(math.Copysign(0, -1)), inf, -inf, nan, 1, -1, math.MaxFloat32, -math.MaxFloat32, 1e-45}
	n := len(special) * len(special)
	base := adamwState{params: make([]float32, n), m: make([]float32, n), v: make([]float32, n), grads: make([]float32, n),
		decay: make([]bool, n)}
	for i := range n {
		base.grads[i], base.m[i] = special[i%len(special)], special[i/len(special)]
		base.params[i], base.v[i] = special[(i*7)%len(special)], float32(math.Abs(float64(special[(i*3)%len(special)])))
		base.decay[i] = i%2 == 0
	}
	for _, kern := range kernelsForCPU() {
		t.Run(kern.name, func(t *testing.T) {
			want, got := base.clone(), base.clone()
			goAdamW(want.params, want.m, want.v, want.grads, want.decay, &adamwSteps[1])
			newEngine(1, kern).AdamW(got.params, got.m, got.v, got.grads, spansOf(got.decay), adamwSteps[1])
			requireSameBits(t, want.params, got.params, "params")
			requireSameBits(t, want.m, got.m, "m")
			requireSameBits(t, want.v, got.v, "v")
		})
	}
}

// TestAdamWKernelPerISA checks that each micro-kernel the CPU runs gets
// the AdamW kernel of its own instruction set, so that
// TestAdamWKernelsAgree runs every AdamW path the CPU has.
func TestAdamWKernelPerISA(t *testing.T) {
	want := map[string]string{"avx512-12x32": "avx512", "avx2-fma-6x16": "avx2", "go-6x16": "go"}
	for _, kern := range kernelsForCPU() {
		require.Equal(t, want[kern.name], adamwISA(kern), kern.name)
	}
}

func TestAdamWPanicsOnLengths(t *testing.T) {
	e := New(1)
	require.PanicsWithValue(t, "kernels: AdamW with len(params)=2 len(m)=2 len(v)=2 len(grads)=1", func() {
		e.AdamW(make([]float32, 2), make([]float32, 2), make([]float32, 2), make([]float32, 1), nil, adamwSteps[0])
	})
}

// BenchmarkAdamW reports ns per element of AdamW on the bench model's
// 842496 parameters, per kernel, on one and two threads, with weight decay
// on spans the size of a block's weight matrices and undecayed gaps the
// size of its biases between them.
func BenchmarkAdamW(b *testing.B) {
	r := rand.New(rand.NewPCG(33, 34))
	s := newAdamWState(r, 842496, false, false)
	var decay []Span
	for lo := 0; lo+16384 <= len(s.params); lo += 16384 + 128 {
		decay = append(decay, Span{lo, lo + 16384})
	}
	for _, kern := range kernelsForCPU() {
		for _, threads := range []int{1, 2} {
			e := newEngine(threads, kern)
			b.Run(fmt.Sprintf("%s/threads=%d", kern.name, threads), func(b *testing.B) {
				for b.Loop() {
					e.AdamW(s.params, s.m, s.v, s.grads, decay, adamwSteps[0])
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(s.params)), "ns/elem")
			})
		}
	}
}

// TestAdamWSpansRefused: spans out of order, overlapping, empty or past
// the buffer are a bug in the caller, and AdamW says which.
func TestAdamWSpansRefused(t *testing.T) {
	tests := []struct {
		name  string
		spans []Span
	}{
		{"out of order", []Span{{5, 8}, {1, 3}}},
		{"overlapping", []Span{{1, 5}, {4, 8}}},
		{"empty", []Span{{3, 3}}},
		{"past the end", []Span{{8, 11}}},
		{"negative", []Span{{-1, 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Error(t, CheckSpans(tc.spans, 10))
			b := make([]float32, 10)
			require.PanicsWithValue(t, "kernels: AdamW: "+CheckSpans(tc.spans, 10).Error(), func() {
				New(1).AdamW(b, b, b, b, tc.spans, adamwSteps[0])
			})
		})
	}
	require.NoError(t, CheckSpans([]Span{{0, 2}, {2, 5}, {9, 10}}, 10), "touching spans are fine")
}

// TestAdamWKeepingKeepsAndUpdates: AdamWKeeping leaves in keep the state
// as it was before the update and gives params, m and v AdamW's bits, on
// any thread count, with keep.Params separate or in grads' own memory.
func TestAdamWKeepingKeepsAndUpdates(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	n := 3*adamwChunk + 123 // chunks on both threads and a tail
	base := newAdamWState(r, n, true, false)
	for _, threads := range []int{1, 2} {
		for _, inGrads := range []bool{false, true} {
			t.Run(fmt.Sprintf("threads=%d/in grads=%v", threads, inGrads), func(t *testing.T) {
				want, got := base.clone(), base.clone()
				e := New(threads)
				e.AdamW(want.params, want.m, want.v, want.grads, spansOf(want.decay), adamwSteps[1])
				keep := Kept{Params: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
				if inGrads {
					keep.Params = got.grads
				}
				e.AdamWKeeping(got.params, got.m, got.v, got.grads, keep, spansOf(got.decay), adamwSteps[1])
				requireSameBits(t, want.params, got.params, "params")
				requireSameBits(t, want.m, got.m, "m")
				requireSameBits(t, want.v, got.v, "v")
				requireSameBits(t, base.params, keep.Params, "kept params")
				requireSameBits(t, base.m, keep.M, "kept m")
				requireSameBits(t, base.v, keep.V, "kept v")
			})
		}
	}
	require.PanicsWithValue(t, "kernels: AdamWKeeping with len(params)=2, keep's 2 2 1", func() {
		b := make([]float32, 2)
		New(1).AdamWKeeping(b, b, b, b, Kept{Params: b, M: b, V: b[:1]}, nil, adamwSteps[0])
	})
}
