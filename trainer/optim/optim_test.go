package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/trainer/kernels"

	"github.com/stretchr/testify/require"
)

// trainToml is [optim] of the shipped train.toml with [train] steps = 200.
var trainToml = Config{LR: 3e-3, MinLR: 3e-4, Warmup: 20, Steps: 200, Beta1: 0.9, Beta2: 0.95,
	Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}

func TestValidate(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name string
		edit func(*Config)
		err  string
	}{
		{"train.toml", func(*Config) {}, ""},
		{"no warmup", func(c *Config) { c.Warmup = 0 }, ""},
		{"no clipping", func(c *Config) { c.GradClip = 0 }, ""},
		{"zero lr", func(c *Config) { c.LR = 0 }, "lr = 0, want > 0"},
		{"nan lr", func(c *Config) { c.LR = nan }, "lr = NaN"},
		{"min over lr", func(c *Config) { c.MinLR = 1 }, "min_lr = 1, want between 0 and lr = 0.003"},
		{"no steps", func(c *Config) { c.Steps = 0 }, "steps = 0, want >= 1"},
		{"warmup over steps", func(c *Config) { c.Warmup = 201 }, "warmup = 201, want between 0 and steps = 200"},
		{"beta1 one", func(c *Config) { c.Beta1 = 1 }, "beta1 = 1, want in [0, 1)"},
		{"beta2 negative", func(c *Config) { c.Beta2 = -0.1 }, "beta2 = -0.1"},
		{"eps zero", func(c *Config) { c.Eps = 0 }, "eps = 0, want > 0"},
		{"decay negative", func(c *Config) { c.WeightDecay = -1 }, "weight_decay = -1"},
		{"clip nan", func(c *Config) { c.GradClip = nan }, "grad_clip = NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := trainToml
			tc.edit(&c)
			err := c.Validate()
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.err)
			}
		})
	}
}

func TestLRSchedule(t *testing.T) {
	for _, tc := range []struct {
		step int
		want float64
	}{
		{0, 3e-3 / 20},      // first warmup step is not zero
		{9, 3e-3 * 10 / 20}, // linear
		{19, 3e-3},          // warmup ends at the peak
		{20, 3e-3},          // cosine starts at the peak
		{65, 3e-4 + 2.7e-3*0.5*(1+math.Cos(math.Pi/4))},
		{110, 3e-4 + 2.7e-3/2}, // half way down
		{155, 3e-4 + 2.7e-3*0.5*(1+math.Cos(3*math.Pi/4))},
		{199, 3e-4 + 2.7e-3*0.5*(1+math.Cos(math.Pi*179/180))},
		{200, 3e-4}, // reaches min_lr at steps
		{5000, 3e-4},
	} {
		require.InDelta(t, tc.want, trainToml.LRAt(tc.step), 1e-15, "step %d", tc.step)
	}
	noWarmup := trainToml
	noWarmup.Warmup = 0
	require.Equal(t, 3e-3, noWarmup.LRAt(0))
	allWarmup := trainToml
	allWarmup.Warmup = 200
	require.InDelta(t, 3e-3, allWarmup.LRAt(199), 1e-15)
	require.Equal(t, 3e-4, allWarmup.LRAt(200))
}

func TestClip(t *testing.T) {
	require.Equal(t, 25.0, SumSquares(kernels.New(1), []float32{3, -4, 0}))
	require.Zero(t, SumSquares(kernels.New(2), nil))
	for _, tc := range []struct {
		name       string
		sumSq, max float64
		want       float64
	}{
		{"under", 0.25, 1, 1},
		{"at", 1, 1, 1},
		{"over", 25, 1, 1 / (5 + 1e-6)},
		{"disabled", 25, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, float64(ClipFactor(tc.sumSq, tc.max)), 1e-7)
		})
	}
	require.True(t, math.IsNaN(float64(ClipFactor(math.Inf(1), 1))))
	require.True(t, math.IsNaN(float64(ClipFactor(math.NaN(), 0))))
}

// constant is a Config whose schedule is a constant 0.01, to compare with torch.optim.AdamW.
var constant = Config{LR: 0.01, MinLR: 0.01, Warmup: 0, Steps: 1000, Beta1: 0.9, Beta2: 0.95,
	Eps: 1e-8, WeightDecay: 0.1}

func TestUpdateOneStepByHand(t *testing.T) {
	params := []float32{1, -2, 0.5, 0.25}
	grads := []float32{0.1, -0.3, 0, 2}
	decay := []kernels.Span{{Lo: 0, Hi: 3}}
	st := NewState(4)
	lr, err := Update(kernels.New(1), constant, &st, params, grads, decay, 1, kernels.Kept{})
	require.NoError(t, err)
	require.Equal(t, 0.01, lr)
	require.Equal(t, 1, st.Step)
	// Step 1: m = 0.1 g, v = 0.05 g², so m̂ = g and v̂ = g²: the step is lr*g/(|g|+eps),
	// after decoupled decay p *= 1 - lr*wd = 0.999 where decayed.
	step := func(g float64) float64 {
		if g == 0 {
			return 0
		}
		return 0.01 * g / (math.Abs(g) + 1e-8)
	}
	want := []float64{1*0.999 - step(0.1), -2*0.999 - step(-0.3), 0.5 * 0.999, 0.25 - step(2)}
	for i := range want {
		require.InDelta(t, want[i], float64(params[i]), 1e-7, i)
	}
	require.InDeltaSlice(t, []float64{0.1 * 0.1, 0.1 * -0.3, 0, 0.1 * 2}, to64(st.M), 1e-8)
	require.InDeltaSlice(t, []float64{0.05 * 0.01, 0.05 * 0.09, 0, 0.05 * 4}, to64(st.V), 1e-8)
	require.Equal(t, []float32{0.1, -0.3, 0, 2}, grads, "grads unchanged")
}

// TestUpdateMatchesTorch compares two steps, the second clipped by 0.5, with
// torch.optim.AdamW (PyTorch 1.13, float64) on the same numbers, with decay on the first three
// parameters only (two param groups).
func TestUpdateMatchesTorch(t *testing.T) {
	params := []float32{1, -2, 0.5, 0.25, -0.75}
	decay := []kernels.Span{{Lo: 0, Hi: 3}}
	st := NewState(5)
	_, err := Update(kernels.New(1), constant, &st, params, []float32{0.1, -0.3, 0, 2, -0.5}, decay, 1, kernels.Kept{})
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{0.9890000009999999, -1.9880000003333334, 0.4995,
		0.24000000005, -0.7400000002}, to64(params), 1e-7)
	_, err = Update(kernels.New(1), constant, &st, params, []float32{-0.2, 0.4, 1e-3, 1, 0.5}, decay, 0.5, kernels.Kept{})
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{0.988537316735842, -1.9845597554172119, 0.4916511052343891,
		0.23160029519815808, -0.7373163057875828}, to64(params), 1e-6)
	require.InDeltaSlice(t, []float64{-0.001, -0.007, 5e-05}, to64(st.M[:3]), 1e-9)
	require.InDeltaSlice(t, []float64{0.000975, 0.006275, 1.25e-08}, to64(st.V[:3]), 1e-9)
}

// TestUpdateSplitsOverRanks checks that updating two halves of a buffer separately, as two
// ranks would, gives the same bits as updating it whole.
func TestUpdateSplitsOverRanks(t *testing.T) {
	n := 101
	params, grads, decay := make([]float32, n), make([]float32, n), make([]bool, n)
	for i := range params {
		params[i] = float32(math.Sin(float64(i)))
		grads[i] = float32(math.Cos(float64(3 * i)))
		decay[i] = i%3 != 0
	}
	whole := append([]float32(nil), params...)
	ws := NewState(n)
	split := append([]float32(nil), params...)
	lo, hi := NewState(40), NewState(n-40)
	for range 3 {
		_, err := Update(kernels.New(2), trainToml, &ws, whole, grads, spansOf(decay), 0.7, kernels.Kept{})
		require.NoError(t, err)
		_, err = Update(kernels.New(2), trainToml, &lo, split[:40], grads[:40], spansOf(decay[:40]), 0.7, kernels.Kept{})
		require.NoError(t, err)
		_, err = Update(kernels.New(2), trainToml, &hi, split[40:], grads[40:], spansOf(decay[40:]), 0.7, kernels.Kept{})
		require.NoError(t, err)
	}
	require.Equal(t, whole, split)
	require.Equal(t, ws.M, append(lo.M, hi.M...))
	require.Equal(t, ws.V, append(lo.V, hi.V...))
}

func TestUpdateRejectsMismatchedLengths(t *testing.T) {
	st := NewState(3)
	params := []float32{1, 2, 3}
	_, err := Update(kernels.New(2), trainToml, &st, params, []float32{1, 2}, nil, 1, kernels.Kept{})
	require.ErrorContains(t, err, "lengths differ: params 3, grads 2")
	_, err = Update(kernels.New(2), trainToml, &st, params, []float32{1, 2, 3}, []kernels.Span{{Lo: 2, Hi: 4}}, 1, kernels.Kept{})
	require.ErrorContains(t, err, "weight decay: span 0 [2, 4)")
	three := []float32{0, 0, 0}
	_, err = Update(kernels.New(2), trainToml, &st, params, []float32{1, 2, 3}, nil, 1, kernels.Kept{Params: three, M: three, V: three[:2]})
	require.ErrorContains(t, err, "the copy's lengths differ from params 3: 3, 3, 2")
	require.Equal(t, []float32{1, 2, 3}, params)
	require.Zero(t, st.Step)
}

func to64(p []float32) []float64 {
	out := make([]float64, len(p))
	for i, v := range p {
		out[i] = float64(v)
	}
	return out
}

// scalarUpdate is Update as plain scalar Go, one element after the other:
// the code the kernels must match bit for bit. The explicit float64
// conversions round each product, as Go on amd64 (GOAMD64 v1) does
// anyway, so that no compiler fuses a multiply-add here either.
func scalarUpdate(c Config, st *State, params, grads []float32, decay []bool, clip float32) {
	lr := c.LRAt(st.Step)
	st.Step++
	t := float64(st.Step)
	bc1 := 1 - math.Pow(c.Beta1, t)
	bc2 := 1 - math.Pow(c.Beta2, t)
	shrink := 1 - lr*c.WeightDecay
	k := float64(clip)
	for i, p := range params {
		g := float64(k * float64(grads[i]))
		pp := float64(p)
		if decay != nil && decay[i] {
			pp *= shrink
		}
		m := float64(c.Beta1*float64(st.M[i])) + float64((1-c.Beta1)*g)
		v := float64(c.Beta2*float64(st.V[i])) + float64(float64((1-c.Beta2)*g)*g)
		st.M[i], st.V[i] = float32(m), float32(v)
		pp -= float64(lr*(m/bc1)) / (math.Sqrt(v/bc2) + c.Eps)
		params[i] = float32(pp)
	}
}

// TestUpdateMatchesScalarBits runs Update on every kernel the CPU has
// (and the portable one) on 1 and 2 threads, and scalarUpdate, for 25
// steps of train.toml's schedule with clipping on some, with and without
// a decay mask, and requires the same bits everywhere.
func TestUpdateMatchesScalarBits(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	const n = 40000 // over two chunks of the split, and a tail
	for _, kernel := range kernels.Available() {
		for _, threads := range []int{1, 2} {
			for _, withDecay := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/threads=%d/decay=%v", kernel, threads, withDecay), func(t *testing.T) {
					e, err := kernels.NewWithKernel(threads, kernel)
					require.NoError(t, err)
					params, grads := make([]float32, n), make([]float32, n)
					var decay []bool
					if withDecay {
						decay = make([]bool, n)
					}
					for i := range params {
						params[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-4)))
						if decay != nil {
							decay[i] = r.IntN(4) != 0
						}
					}
					want, wst := append([]float32(nil), params...), NewState(n)
					got, gst := append([]float32(nil), params...), NewState(n)
					for step := range 25 {
						for i := range grads {
							grads[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-6)))
						}
						clip := float32(1)
						if step%3 == 1 {
							clip = 0.137
						}
						scalarUpdate(trainToml, &wst, want, grads, decay, clip)
						_, err := Update(e, trainToml, &gst, got, grads, spansOf(decay), clip, kernels.Kept{})
						require.NoError(t, err)
					}
					require.Equal(t, wst.Step, gst.Step)
					for i := range want {
						require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "params[%d]", i)
						require.Equal(t, math.Float32bits(wst.M[i]), math.Float32bits(gst.M[i]), "m[%d]", i)
						require.Equal(t, math.Float32bits(wst.V[i]), math.Float32bits(gst.V[i]), "v[%d]", i)
					}
				})
			}
		}
	}
}

// spansOf is the spans of the runs of true in mask, for Update.
func spansOf(mask []bool) []kernels.Span {
	var spans []kernels.Span
	for i, d := range mask {
		switch {
		case !d:
		case len(spans) > 0 && spans[len(spans)-1].Hi == i:
			spans[len(spans)-1].Hi++
		default:
			spans = append(spans, kernels.Span{Lo: i, Hi: i + 1})
		}
	}
	return spans
}
