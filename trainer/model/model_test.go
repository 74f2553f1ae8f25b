package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/trainer/kernels"
)

// An idle kernels team lets go of its goroutines within ~20 ms by itself (tested in kernels);
// goleak need not wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/gorun/gorun/trainer/kernels.(*team).work"))
}

// defaultConfig is [model] of the shipped train.toml.
var defaultConfig = Config{Layers: 2, DModel: 64, Heads: 4, Context: 64, Vocab: 256}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		errs []string
	}{
		{"default", defaultConfig, nil},
		{"tiny", Config{Layers: 1, DModel: 2, Heads: 1, Context: 1, Vocab: 1}, nil},
		{"zero", Config{}, []string{"layers = 0", "d_model = 0", "heads = 0", "context = 0", "vocab = 0"}},
		{"heads do not divide", Config{Layers: 1, DModel: 10, Heads: 4, Context: 8, Vocab: 256},
			[]string{"d_model = 10 is not a multiple of heads = 4"}},
		{"vocab over a byte", Config{Layers: 1, DModel: 8, Heads: 2, Context: 8, Vocab: 257},
			[]string{"vocab = 257, want <= 256"}},
		{"huge", Config{Layers: 1, DModel: 1 << 20, Heads: 1, Context: 8, Vocab: 256},
			[]string{"d_model = 1048576, want <= 65536"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.errs == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, e := range tc.errs {
				require.Contains(t, err.Error(), e)
			}
		})
	}
}

// TestTrainFLOPsPerToken checks the formula on hand-counted models: the
// products of one token forward, times 3 for forward and backward.
func TestTrainFLOPsPerToken(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want float64
	}{
		// L1 d1 T1 V1: block products 12·1 + head 1 = 13 MACs, attention 2·1·1.
		{Config{Layers: 1, DModel: 1, Heads: 1, Context: 1, Vocab: 1}, 3 * (2*13 + 2*2)},
		// examples/train.toml: L2 d64 T64 V256.
		{Config{Layers: 2, DModel: 64, Heads: 4, Context: 64, Vocab: 256},
			3 * (2*(2*12*64*64+256*64) + 2*2*(2*64*64))},
	} {
		require.Equal(t, tc.want, tc.cfg.TrainFLOPsPerToken(), "%+v", tc.cfg)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	eng := kernels.New(1)
	_, err := New(Config{Layers: 1, DModel: 6, Heads: 4, Context: 4, Vocab: 256}, 1, eng)
	require.ErrorContains(t, err, "not a multiple of heads")
	_, err = New(defaultConfig, 0, eng)
	require.ErrorContains(t, err, "micro batch = 0")
	_, err = New(defaultConfig, 1, nil)
	require.ErrorContains(t, err, "nil kernels engine")
}

func TestLayout(t *testing.T) {
	l := NewLayout(defaultConfig)
	d := 64
	perBlock := 4*d + (3*d*d + 3*d) + (d*d + d) + (4*d*d + 4*d) + (4*d*d + d)
	require.Equal(t, 256*d+64*d+2*perBlock+2*d, l.Size)
	require.Len(t, l.Tensors, 2+2*12+2)
	seen := map[string]bool{}
	off := 0
	for _, ti := range l.Tensors {
		require.False(t, seen[ti.Name], ti.Name)
		seen[ti.Name] = true
		require.Equal(t, off, ti.Offset, ti.Name)
		off += ti.Len()
	}
	require.Equal(t, l.Size, off)

	qkv, ok := l.Find("h.1.attn.c_attn.weight")
	require.True(t, ok)
	require.Equal(t, []int{3 * d, d}, qkv.Shape)
	_, ok = l.Find("lm_head.weight")
	require.False(t, ok, "the output projection is tied to wte")

	for _, s := range []int{1, 2, 3, 7, 64} {
		p := l.PaddedSize(s)
		require.Zero(t, p%s)
		require.GreaterOrEqual(t, p, l.Size)
		require.Less(t, p-l.Size, s)
	}

	mask := maskOf(l.DecaySpans(0, l.PaddedSize(7)), l.PaddedSize(7))
	for _, ti := range l.Tensors {
		want := len(ti.Shape) == 2
		require.Equal(t, want, mask[ti.Offset], ti.Name)
		require.Equal(t, want, mask[ti.Offset+ti.Len()-1], ti.Name)
	}
	for _, m := range mask[l.Size:] {
		require.False(t, m, "padding is not decayed")
	}
}

// maskOf is spans as one flag per element of a buffer of n elements.
func maskOf(spans []kernels.Span, n int) []bool {
	mask := make([]bool, n)
	for _, s := range spans {
		for i := s.Lo; i < s.Hi; i++ {
			mask[i] = true
		}
	}
	return mask
}

// TestDecaySpans: the spans of a slice are the whole buffer's, cut to the slice and counted
// from its start, wherever the slice starts and ends; they are few (adjacent decayed tensors
// are one span) and valid for AdamW.
func TestDecaySpans(t *testing.T) {
	l := NewLayout(defaultConfig)
	n := l.PaddedSize(7)
	whole := maskOf(l.DecaySpans(0, n), n)
	w, ok := l.Find("h.0.attn.c_attn.weight") // decayed, then its bias is not
	require.True(t, ok)
	end := w.Offset + w.Len()
	tests := []struct {
		name   string
		lo, hi int
	}{
		{"whole buffer", 0, n},
		{"first shard of 7", 0, n / 7},
		{"last shard of 7, with the padding", n - n/7, n},
		{"the padding alone", l.Size, n},
		{"across the end of a decayed tensor", end - 3, end + 3},
		{"starting at the end of a decayed tensor", end, end + 5},
		{"one element", w.Offset, w.Offset + 1},
		{"empty", 5, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := l.DecaySpans(tc.lo, tc.hi)
			require.NoError(t, kernels.CheckSpans(got, tc.hi-tc.lo))
			require.Equal(t, whole[tc.lo:tc.hi], maskOf(got, tc.hi-tc.lo))
			require.LessOrEqual(t, len(got), len(l.Tensors))
		})
	}
	require.Empty(t, l.DecaySpans(7, 3), "hi below lo is an empty slice")
	wte, _ := l.Find("wte.weight")
	wpe, _ := l.Find("wpe.weight")
	require.Equal(t, []kernels.Span{{Lo: 0, Hi: wte.Len() + wpe.Len()}}, l.DecaySpans(0, wpe.Offset+wpe.Len()),
		"wte and wpe, adjacent and both decayed, are one span")
}

func TestInit(t *testing.T) {
	cfg := defaultConfig
	l := NewLayout(cfg)
	a := make([]float32, l.Size+5)
	for i := range a[l.Size:] {
		a[l.Size+i] = 42
	}
	b := make([]float32, l.Size)
	Init(cfg, a, 7)
	Init(cfg, b, 7)
	require.Equal(t, b, a[:l.Size], "same seed, same bits")
	require.Equal(t, []float32{42, 42, 42, 42, 42}, a[l.Size:], "padding untouched")
	Init(cfg, b, 8)
	require.NotEqual(t, b, a[:l.Size])

	std := func(p []float32) float64 {
		var s, ss float64
		for _, v := range p {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		mu := s / float64(len(p))
		return math.Sqrt(ss/float64(len(p)) - mu*mu)
	}
	for _, ti := range l.Tensors {
		p := a[ti.Offset : ti.Offset+ti.Len()]
		switch ti.Name {
		case "wte.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.weight":
			require.InDelta(t, 0.02, std(p), 0.001, ti.Name)
		case "h.0.attn.c_proj.weight", "h.1.mlp.c_proj.weight":
			require.InDelta(t, 0.02/math.Sqrt(4), std(p), 0.001, ti.Name)
		case "h.0.ln_1.weight", "ln_f.weight":
			for _, v := range p {
				require.Equal(t, float32(1), v, ti.Name)
			}
		case "h.0.ln_1.bias", "h.0.attn.c_attn.bias", "h.1.mlp.c_proj.bias", "ln_f.bias":
			for _, v := range p {
				require.Zero(t, v, ti.Name)
			}
		}
	}
}

// randomTokens returns n random bytes below vocab.
func randomTokens(n, vocab int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(vocab))
	}
	return b
}

// noisyParams is an initialized buffer with noise added to every parameter (gains and biases
// too), so that a gradient check exercises attention, layer norm and GELU away from the
// near-linear regime of a fresh init.
func noisyParams(cfg Config, seed uint64, noise float64) []float32 {
	p := make([]float32, NewLayout(cfg).Size)
	Init(cfg, p, seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	for i := range p {
		p[i] += float32(rng.NormFloat64() * noise)
	}
	return p
}

func TestInitialLossIsLogVocab(t *testing.T) {
	cfg := defaultConfig
	m, err := New(cfg, 4, kernels.New(2))
	require.NoError(t, err)
	p := make([]float32, m.Layout().Size)
	Init(cfg, p, 1)
	loss := m.Forward(p, randomTokens(m.TokensLen(), 256, 3))
	require.InDelta(t, math.Log(256), float64(loss), 0.05)
}

func TestForwardMatchesReference(t *testing.T) {
	for _, cfg := range []Config{
		{Layers: 1, DModel: 8, Heads: 2, Context: 4, Vocab: 256},
		{Layers: 2, DModel: 12, Heads: 3, Context: 7, Vocab: 40},
	} {
		m, err := New(cfg, 2, kernels.New(1))
		require.NoError(t, err)
		p := noisyParams(cfg, 5, 0.3)
		tok := randomTokens(m.TokensLen(), cfg.Vocab, 6)
		got := m.Forward(p, tok)
		want := refLoss(cfg, to64(p), tok, 2)
		require.InEpsilon(t, want, float64(got), 1e-5)
	}
}

func to64(p []float32) []float64 {
	out := make([]float64, len(p))
	for i, v := range p {
		out[i] = float64(v)
	}
	return out
}

// TestGradientCheck compares Backward with central differences of the float64 reference,
// tensor by tensor: every element of small tensors, a random sample of large ones (a smaller
// one with -short, as under -race, where this serial float64 code only costs time).
func TestGradientCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		batch int
		long  bool
	}{
		{"1 layer d8", Config{Layers: 1, DModel: 8, Heads: 2, Context: 4, Vocab: 256}, 2, false},
		{"2 layers d16", Config{Layers: 2, DModel: 16, Heads: 2, Context: 8, Vocab: 256}, 2, true},
		{"2 layers d12 3 heads small vocab", Config{Layers: 2, DModel: 12, Heads: 3, Context: 5, Vocab: 20}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.long && testing.Short() {
				t.Skip("slow float64 reference; run without -short")
			}
			cfg := tc.cfg
			m, err := New(cfg, tc.batch, kernels.New(2))
			require.NoError(t, err)
			l := m.Layout()
			p := noisyParams(cfg, 11, 0.3)
			tok := randomTokens(m.TokensLen(), cfg.Vocab, 12)
			const scale = 0.75
			grads := make([]float32, l.Size)
			m.Forward(p, tok)
			m.Backward(p, grads, scale)

			p64 := to64(p)
			rng := rand.New(rand.NewPCG(13, 0))
			const h = 1e-6
			sample := 120
			if testing.Short() {
				sample = 16
			}
			for _, ti := range l.Tensors {
				idx := make([]int, ti.Len())
				for i := range idx {
					idx[i] = ti.Offset + i
				}
				if len(idx) > sample {
					rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
					idx = idx[:sample]
				}
				var diff2, num2, worst float64
				for _, i := range idx {
					orig := p64[i]
					p64[i] = orig + h
					up := refLoss(cfg, p64, tok, tc.batch)
					p64[i] = orig - h
					down := refLoss(cfg, p64, tok, tc.batch)
					p64[i] = orig
					num := scale * (up - down) / (2 * h)
					d := float64(grads[i]) - num
					diff2 += d * d
					num2 += num * num
					worst = max(worst, math.Abs(d))
				}
				rel := math.Sqrt(diff2 / max(num2, 1e-30))
				t.Logf("%-24s |g|=%.3e rel=%.2e worst=%.2e", ti.Name, math.Sqrt(num2), rel, worst)
				require.Less(t, rel, 1e-4, ti.Name)
			}
		})
	}
}

// TestBackwardAccumulates checks that Backward adds scale times the gradient.
func TestBackwardAccumulates(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 16, Heads: 4, Context: 8, Vocab: 256}
	m, err := New(cfg, 3, kernels.New(1))
	require.NoError(t, err)
	p := noisyParams(cfg, 1, 0.1)
	m.Forward(p, randomTokens(m.TokensLen(), 256, 2))
	one := make([]float32, m.Layout().Size+3)
	m.Backward(p, one, 1)
	twice := make([]float32, len(one))
	m.Backward(p, twice, 0.5)
	m.Backward(p, twice, 1.5)
	for i := range one {
		require.InDelta(t, 2*one[i], twice[i], 1e-6+1e-5*math.Abs(float64(one[i])), i)
	}
	require.Equal(t, []float32{0, 0, 0}, one[m.Layout().Size:], "padding untouched")
}

// TestKeyBiasGetsNoGradient checks that the key part of every c_attn bias gradient is exactly
// 0, not rounding noise (its gradient is exactly 0: softmax ignores a constant added to
// every key's score) while it adds to the query and value parts, and that the loss does not
// move when the key bias does, which is why 0 is right.
func TestKeyBiasGetsNoGradient(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 16, Heads: 4, Context: 8, Vocab: 256}
	m, err := New(cfg, 3, kernels.New(2))
	require.NoError(t, err)
	d := cfg.DModel
	p := noisyParams(cfg, 5, 0.2)
	tok := randomTokens(m.TokensLen(), 256, 6)
	loss := m.Forward(p, tok)
	g := make([]float32, m.Layout().Size)
	m.Backward(p, g, 1)
	moved := slices.Clone(p)
	for _, ti := range m.Layout().Tensors {
		if !strings.HasSuffix(ti.Name, "attn.c_attn.bias") {
			continue
		}
		bias := g[ti.Offset : ti.Offset+ti.Len()]
		for _, part := range []struct {
			name   string
			lo, hi int
		}{{"query", 0, d}, {"value", 2 * d, 3 * d}} {
			require.True(t, slices.ContainsFunc(bias[part.lo:part.hi], func(x float32) bool { return x != 0 }),
				"%s: %s part gets a gradient", ti.Name, part.name)
		}
		require.Equal(t, make([]float32, d), bias[d:2*d], "%s: key part exactly 0", ti.Name)
		for i := ti.Offset + d; i < ti.Offset+2*d; i++ {
			moved[i] += 0.5
		}
	}
	require.InEpsilon(t, loss, m.Forward(moved, tok), 1e-5, "the loss does not depend on the key bias")
}

// TestDeterministic runs the same micro-batch on two models with the same thread count and
// requires bit-identical losses and gradients, and so must a different thread count: the
// trainer relies on a micro batch's gradient being the same bits on any rank.
func TestDeterministic(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 32, Heads: 4, Context: 16, Vocab: 256}
	p := noisyParams(cfg, 3, 0.05)
	tok := randomTokens(4*(cfg.Context+1), 256, 4)
	run := func(threads int) (float32, []float32) {
		m, err := New(cfg, 4, kernels.New(threads))
		require.NoError(t, err)
		g := make([]float32, m.Layout().Size)
		loss := m.Forward(p, tok)
		m.Backward(p, g, 1)
		return loss, g
	}
	l1, g1 := run(3)
	l2, g2 := run(3)
	require.Equal(t, math.Float32bits(l1), math.Float32bits(l2))
	require.Equal(t, g1, g2)
	l3, g3 := run(1)
	require.Equal(t, math.Float32bits(l1), math.Float32bits(l3))
	require.Equal(t, g1, g3)
}

// TestKernelsAgree runs the same micro-batch with every micro-kernel the CPU runs (the widest
// ISA down to the portable Go one) and requires the loss and gradients of each to agree
// closely with the portable kernel's.
func TestKernelsAgree(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 32, Heads: 4, Context: 40, Vocab: 256}
	p := noisyParams(cfg, 5, 0.05)
	tok := randomTokens(3*(cfg.Context+1), 256, 6)
	run := func(kernel string) (float32, []float32) {
		eng, err := kernels.NewWithKernel(2, kernel)
		require.NoError(t, err)
		m, err := New(cfg, 3, eng)
		require.NoError(t, err)
		g := make([]float32, m.Layout().Size)
		loss := m.Forward(p, tok)
		m.Backward(p, g, 1)
		return loss, g
	}
	avail := kernels.Available()
	lRef, gRef := run(avail[len(avail)-1])
	for _, kernel := range avail[:len(avail)-1] {
		l, g := run(kernel)
		require.InEpsilon(t, lRef, l, 1e-6, kernel)
		for i := range gRef {
			require.InDelta(t, gRef[i], g[i], 1e-6+1e-4*math.Abs(float64(gRef[i])), "%s: gradient %d", kernel, i)
		}
	}
}

func TestForwardPanicsOnCallerBugs(t *testing.T) {
	cfg := Config{Layers: 1, DModel: 8, Heads: 2, Context: 4, Vocab: 16}
	m, err := New(cfg, 2, kernels.New(1))
	require.NoError(t, err)
	p := make([]float32, m.Layout().Size)
	Init(cfg, p, 1)
	require.PanicsWithValue(t, "model: Backward before Forward", func() { m.Backward(p, p, 1) })
	require.Panics(t, func() { m.Forward(p[:10], make([]byte, m.TokensLen())) })
	require.Panics(t, func() { m.Forward(p, make([]byte, m.TokensLen()-1)) })
	bad := make([]byte, m.TokensLen())
	bad[3] = 16
	require.PanicsWithValue(t, "model: token 16 >= vocab 16", func() { m.Forward(p, bad) })
}

// BenchmarkForwardBackward times one forward and backward pass of the default config with a
// micro-batch of 8, on 1 and 2 threads, with activation checkpointing off and on, and reports
// tokens per second and the rate of the matrix products (which are nearly all of the time; the
// recomputation's products are not counted, as in the trainer's mfu).
func BenchmarkForwardBackward(b *testing.B) {
	for _, threads := range []int{1, 2} {
		for _, ckpt := range []bool{false, true} {
			b.Run(fmt.Sprintf("threads=%d/checkpointing=%v", threads, ckpt), func(b *testing.B) {
				cfg, batch := defaultConfig, 8
				m, err := New(cfg, batch, kernels.New(threads), WithActivationCheckpointing(ckpt))
				require.NoError(b, err)
				p := make([]float32, m.Layout().Size)
				g := make([]float32, len(p))
				Init(cfg, p, 1)
				tok := randomTokens(m.TokensLen(), 256, 1)
				for b.Loop() {
					m.Forward(p, tok)
					m.Backward(p, g, 1)
				}
				sec := b.Elapsed().Seconds()
				b.ReportMetric(float64(b.N*batch*cfg.Context)/sec, "tokens/s")
				b.ReportMetric(float64(b.N*batch*cfg.Context)*cfg.TrainFLOPsPerToken()/sec/1e9, "GFLOP/s")
			})
		}
	}
}
