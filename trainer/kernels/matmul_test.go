package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// An idle team lets go of its goroutines within ~20 ms by itself (TestIdleTeamLetsGoOfItsGoroutines);
// goleak need not wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/gorun/gorun/trainer/kernels.(*team).work"))
}

// testKernels is every kernel the CPU runs, and each that has a narrow
// alternative once more without it, so that its own tile runs on every
// shape.
func testKernels() []*microKernel {
	var ks []*microKernel
	for _, k := range kernelsForCPU() {
		ks = append(ks, k)
		if k.narrow != nil {
			alone := *k
			alone.name, alone.narrow = k.name+"-alone", nil
			ks = append(ks, &alone)
		}
	}
	return ks
}

// TestForShape checks when a kernel hands a product to its narrow one.
func TestForShape(t *testing.T) {
	wide := &microKernel{name: "wide", mr: 12, nr: 32}
	wide.narrow = &microKernel{name: "narrow", mr: 6, nr: 16}
	for _, tc := range []struct {
		m, n int
		want string
	}{
		{64, 16, "narrow"}, {128, 32, "wide"}, {64, 64, "wide"}, {12, 48, "wide"}, {6, 16, "narrow"}, {1000, 8, "narrow"},
	} {
		require.Equal(t, tc.want, wide.forShape(tc.m, tc.n).name, "%dx%d", tc.m, tc.n)
	}
	require.Equal(t, "narrow", wide.narrow.forShape(64, 16).name, "no narrow: itself")
}

// shape is one product m×n×k.
type shape struct{ m, n, k int }

// testShapes cover single elements, primes, partial tiles in both
// directions, exact tiles, tall and skinny products, and k past one kc
// block and n past one nc block.
var testShapes = []shape{
	{1, 1, 1}, {2, 3, 5}, {7, 13, 5}, {5, 7, 13}, {6, 16, 1}, {6, 16, 8}, {12, 32, 7},
	{64, 64, 64}, {100, 257, 33}, {33, 100, 257}, {1, 300, 17}, {300, 1, 17},
	{513, 3, 9}, {3, 513, 9}, {4, 4, 600}, {150, 50, 300}, {37, 3100, 3},
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

// requireClose checks got against want with a relative tolerance of
// 1e-5 scaled by k: both sum k products, in different orders.
func requireClose(t *testing.T, want, got []float32, k int) {
	t.Helper()
	tol := 1e-5 * float64(max(k, 1))
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		if math.Abs(w-g) > tol*math.Max(1, math.Abs(w)) {
			require.Failf(t, "mismatch", "element %d: want %v, got %v (tol %g)", i, w, g, tol)
		}
	}
}

// TestMatMulMatchesNaive: every kernel on 1 to 4 goroutines computes
// what the naive product does, and the same bits whatever the number of
// goroutines (a micro batch's gradient must not depend on it).
func TestMatMulMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Enough to split rows, columns and both over 3 and 4 goroutines.
	splitShapes := map[shape]bool{{7, 13, 5}: true, {100, 257, 33}: true, {513, 3, 9}: true, {3, 513, 9}: true, {37, 3100, 3}: true}
	for _, s := range testShapes {
		a, b := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n)
		c0 := randSlice(r, s.m*s.n)
		for _, op := range []struct{ transA, transB, acc bool }{
			{false, false, false}, {true, false, false}, {false, true, false}, {true, true, false},
			{false, false, true}, {true, false, true}, {false, true, true}, {true, true, true},
		} {
			want := append([]float32(nil), c0...)
			naiveMatMul(want, a, b, s.m, s.n, s.k, op.transA, op.transB, op.acc)
			for _, kern := range testKernels() {
				var oneThread []float32
				for _, threads := range []int{1, 2, 3, 4} {
					if threads > 2 && !splitShapes[s] {
						continue
					}
					name := fmt.Sprintf("%dx%dx%d/ta=%v,tb=%v,acc=%v/%s/t%d", s.m, s.n, s.k, op.transA, op.transB, op.acc, kern.name, threads)
					t.Run(name, func(t *testing.T) {
						e := newEngine(threads, kern)
						e.minParallel, e.minPacked = 0, 0
						got := append([]float32(nil), c0...)
						e.MatMul(got, a, b, s.m, s.n, s.k, op.transA, op.transB, op.acc)
						requireClose(t, want, got, s.k)
						if threads == 1 {
							oneThread = got
						} else if oneThread != nil {
							require.Equal(t, oneThread, got, "the threads split C, never k: the same bits as one thread")
						}
					})
				}
			}
		}
	}
}

// TestMatMulSmall checks the plain loops small products run as, and
// that New's Engine gives the same as the reference on them.
func TestMatMulSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, s := range testShapes[:6] {
		for _, op := range [][3]bool{{false, false, false}, {true, false, true}, {false, true, false}, {true, true, true}} {
			a, b := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n)
			want := randSlice(r, s.m*s.n)
			got, viaNew := append([]float32(nil), want...), append([]float32(nil), want...)
			naiveMatMul(want, a, b, s.m, s.n, s.k, op[0], op[1], op[2])
			smallMatMul(got, a, b, s.m, s.n, s.k, op[0], op[1], op[2])
			requireClose(t, want, got, s.k)
			New(2).MatMul(viaNew, a, b, s.m, s.n, s.k, op[0], op[1], op[2])
			requireClose(t, want, viaNew, s.k)
		}
	}
}

// TestMatMulBlocks runs products larger than one block of each kind
// (kc, mc, nc) with small blocks, so every loop runs more than once.
func TestMatMulBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, kern := range testKernels() {
		small := *kern
		small.mc, small.kc, small.nc = 2*small.mr, 5, 3*small.nr
		for _, threads := range []int{1, 2, 3} {
			for _, s := range []shape{{50, 70, 23}, {13, 200, 11}, {200, 13, 11}} {
				for _, trans := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/t%d/%dx%dx%d/trans=%v", kern.name, threads, s.m, s.n, s.k, trans), func(t *testing.T) {
						e := newEngine(threads, &small)
						e.minParallel, e.minPacked = 0, 0
						a, b := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n)
						want, got := randSlice(r, s.m*s.n), make([]float32, s.m*s.n)
						copy(got, want)
						naiveMatMul(want, a, b, s.m, s.n, s.k, trans, !trans, true)
						e.MatMul(got, a, b, s.m, s.n, s.k, trans, !trans, true)
						requireClose(t, want, got, s.k)
					})
				}
			}
		}
	}
}

// TestMatMulEmpty checks the products with a zero dimension: no work, or
// C cleared when k is zero and not accumulating.
func TestMatMulEmpty(t *testing.T) {
	e := New(2)
	c := []float32{1, 2, 3, 4}
	e.MatMul(c, nil, nil, 2, 2, 0, false, false, true)
	require.Equal(t, []float32{1, 2, 3, 4}, c)
	e.MatMul(c, nil, nil, 2, 2, 0, false, false, false)
	require.Equal(t, []float32{0, 0, 0, 0}, c)
	e.MatMul(nil, nil, []float32{1}, 0, 1, 1, false, false, false)
	e.MatMul(nil, []float32{1}, nil, 1, 0, 1, true, true, false)
}

// TestMatMulShortSlice checks the documented panic on a caller's bug.
func TestMatMulShortSlice(t *testing.T) {
	e := New(1)
	require.PanicsWithValue(t, "kernels: MatMul 2x2x2 with len(a)=3 len(b)=4 len(c)=4", func() {
		e.MatMul(make([]float32, 4), make([]float32, 3), make([]float32, 4), 2, 2, 2, false, false, false)
	})
	require.Panics(t, func() { e.MatMul(nil, nil, nil, -1, 1, 1, false, false, false) })
}

// TestMatMulConcurrent runs products on one Engine from several
// goroutines at once: the pools must hand each its own buffers.
func TestMatMulConcurrent(t *testing.T) {
	e := New(2)
	e.minParallel, e.minPacked = 0, 0
	r := rand.New(rand.NewPCG(5, 6))
	const m, n, k = 40, 50, 60
	a, b := randSlice(r, m*k), randSlice(r, k*n)
	want := make([]float32, m*n)
	naiveMatMul(want, a, b, m, n, k, false, true, false)
	done := make(chan []float32)
	for range 4 {
		go func() {
			c := make([]float32, m*n)
			for range 20 {
				e.MatMul(c, a, b, m, n, k, false, true, false)
			}
			done <- c
		}()
	}
	for range 4 {
		requireClose(t, want, <-done, k)
	}
}

func TestKernelNames(t *testing.T) {
	require.NotEmpty(t, New(1).Kernel())
	require.Equal(t, "go-6x16", newEngine(1, goKernel()).Kernel())
	require.Equal(t, 3, New(3).Threads())
	require.Equal(t, 1, New(0).Threads())
}

func TestPeakGFLOPS(t *testing.T) {
	for _, kern := range kernelsForCPU() {
		require.Positive(t, newEngine(2, kern).PeakGFLOPS(20*time.Millisecond), kern.name)
	}
	require.Zero(t, New(1).PeakGFLOPS(0))
}

// TestMeasurePeak checks that the per-thread CPU-time peak is positive
// for every kernel and grows with the threads: they add their rates.
func TestMeasurePeak(t *testing.T) {
	for _, kern := range kernelsForCPU() {
		one, two := newEngine(1, kern).MeasurePeak(), newEngine(2, kern).MeasurePeak()
		require.Positive(t, one, kern.name)
		require.Greater(t, two, one, kern.name)
	}
}

// TestSplit checks how split shares the tiles (12×32) of C out, among
// them the bench model's products: 2048 rows (171 panels, the last
// partial) split by rows although a column split has one tile fewer on
// the busiest goroutine, since each goroutine then reads half of op(A),
// not all of it; 128 rows split by columns, where a row split has a sixth
// more tiles.
func TestSplit(t *testing.T) {
	for _, tc := range []struct{ threads, mp, np, tm, tn int }{
		{1, 10, 10, 1, 1},
		{2, 86, 16, 2, 1},
		{2, 1, 16, 1, 2},
		{4, 2, 40, 1, 4}, // as many tiles as 2×2, less of op(B) to read
		{4, 1, 1, 1, 1},
		{3, 201, 75, 3, 1}, // C 2412×2400: as many tiles either way
		{2, 171, 4, 2, 1},  // 2048×128×k
		{2, 171, 12, 2, 1}, // 2048×384×k
		{2, 171, 16, 2, 1}, // 2048×512×k
		{2, 11, 16, 1, 2},  // 128×512×2048
	} {
		tm, tn := split(tc.threads, tc.mp, tc.np, 12, 32)
		require.Equal(t, [2]int{tc.tm, tc.tn}, [2]int{tm, tn}, "%+v", tc)
	}
}

// TestPack checks each kernel's packing routines against the portable
// ones for both panel widths, many lengths and strides.
func TestPack(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, kern := range kernelsForCPU() {
		for _, w := range []int{kern.mr, kern.nr} {
			for _, kc := range []int{0, 1, 3, 4, 5, 7, 8, 9, 16, 17, 31, 64, 257} {
				for _, extra := range []int{0, 1, 13} {
					ld := max(w, kc) + extra
					src := randSlice(r, (max(w, kc)-1)*ld+max(w, kc))
					want, got := make([]float32, w*kc), make([]float32, w*kc)
					goTranspose(want, src, w, ld, kc)
					kern.packTranspose(got, src, w, ld, kc)
					require.Equal(t, want, got, "%s transpose w=%d kc=%d ld=%d", kern.name, w, kc, ld)
					for _, panels := range []int{0, 1, 3} {
						ld, stride := max(ld, w*panels), panelStride(w, kc)
						src := randSlice(r, max(kc-1, 0)*ld+w*panels)
						want, got := make([]float32, stride*panels), make([]float32, stride*panels)
						goCopy(want, src, w, ld, kc, panels, stride)
						kern.packCopy(got, src, w, ld, kc, panels, stride)
						require.Equal(t, want, got, "%s copy w=%d kc=%d ld=%d panels=%d", kern.name, w, kc, ld, panels)
					}
				}
			}
		}
	}
}

// TestNewWithKernel checks that every kernel the CPU runs can be chosen
// by name, the widest first and the portable one last, and that a name
// the CPU does not run is an error.
func TestNewWithKernel(t *testing.T) {
	avail := Available()
	require.NotEmpty(t, avail)
	require.Equal(t, "go-6x16", avail[len(avail)-1])
	require.Equal(t, avail[0], New(1).Kernel())
	for _, name := range avail {
		e, err := NewWithKernel(2, name)
		require.NoError(t, err)
		require.Equal(t, name, e.Kernel())
	}
	_, err := NewWithKernel(1, "sse-1x1")
	require.ErrorContains(t, err, `micro-kernel "sse-1x1"`)
}

// TestMatMulBias checks that MatMulBias gives the bits of setting every
// row of C to the bias and accumulating the product with MatMul, on every
// kernel, both precisions, one and several goroutines, small blocks (so
// that the bias goes into several blocks of C) and the small and k=0
// paths.
func TestMatMulBias(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	var engines []*Engine
	for _, kern := range testKernels() {
		small := *kern
		small.name += "-small"
		small.mc, small.kc, small.nc = 2*small.mr, 5, 3*small.nr
		for _, k := range []*microKernel{kern, &small} {
			for _, threads := range []int{1, 3} {
				e := newEngine(threads, k)
				e.minParallel, e.minPacked = 0, 0
				engines = append(engines, e)
			}
		}
	}
	for _, threads := range []int{1, 2} {
		engines = append(engines, New(threads).WithPrecision(BF16), New(threads))
	}
	for _, e := range engines {
		for _, s := range []shape{{50, 70, 23}, {13, 200, 11}, {200, 13, 11}, {3, 4, 2}, {5, 6, 0}} {
			for _, trans := range [][2]bool{{false, true}, {true, false}} {
				t.Run(fmt.Sprintf("%s/t%d/%dx%dx%d/%v", e.Kernel(), e.Threads(), s.m, s.n, s.k, trans), func(t *testing.T) {
					a, b, bias := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), randSlice(r, s.n)
					want, got := make([]float32, s.m*s.n), randSlice(r, s.m*s.n)
					for i := range s.m {
						copy(want[i*s.n:][:s.n], bias)
					}
					e.MatMul(want, a, b, s.m, s.n, s.k, trans[0], trans[1], true)
					e.MatMulBias(got, a, b, bias, s.m, s.n, s.k, trans[0], trans[1])
					require.Equal(t, want, got)
				})
			}
		}
	}
}

// TestMatMulBiasShortBias checks that a bias shorter than a row of C is a
// panic, as a short slice is for MatMul.
func TestMatMulBiasShortBias(t *testing.T) {
	require.PanicsWithValue(t, "kernels: MatMulBias 2x3x4 with len(bias)=2", func() {
		New(1).MatMulBias(make([]float32, 6), make([]float32, 8), make([]float32, 12), make([]float32, 2), 2, 3, 4, false, false)
	})
}
