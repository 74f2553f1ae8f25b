package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoundBF16(t *testing.T) {
	bits := func(u uint32) float32 { return math.Float32frombits(u) }
	for _, tc := range []struct {
		name    string
		in, out float32
	}{
		{"exact", 1.5, 1.5},
		{"tie to even down", bits(0x3f808000), 1},
		{"tie to even up", bits(0x3f818000), bits(0x3f820000)},
		{"above the tie", bits(0x3f808001), bits(0x3f810000)},
		{"below the tie", bits(0x3f807fff), 1},
		{"negative", -bits(0x3f808001), -bits(0x3f810000)},
		{"largest float to inf", math.MaxFloat32, float32(math.Inf(1))},
		{"subnormal to zero", bits(0x00400000), 0},
		{"negative subnormal to -0", -bits(0x00400000), float32(math.Copysign(0, -1))},
		{"inf", float32(math.Inf(-1)), float32(math.Inf(-1))},
	} {
		got := bits(roundBF16(tc.in))
		require.Equal(t, math.Float32bits(tc.out), math.Float32bits(got), "%s: %v", tc.name, tc.in)
	}
	nan := bits(0x7f800001)
	require.True(t, math.IsNaN(float64(bits(roundBF16(nan)))), "a NaN whose payload is in the low bits stays NaN")
}

func TestParsePrecision(t *testing.T) {
	for _, p := range []Precision{FP32, BF16} {
		got, err := ParsePrecision(p.String())
		require.NoError(t, err)
		require.Equal(t, p, got)
	}
	_, err := ParsePrecision("fp16")
	require.ErrorContains(t, err, `precision "fp16": want fp32 or bf16`)
}

// roundedBF16 is s with every element rounded to bf16.
func roundedBF16(s []float32) []float32 {
	out := make([]float32, len(s))
	for i, v := range s {
		out[i] = math.Float32frombits(roundBF16(v))
	}
	return out
}

// bf16Engine is an fp32 Engine with the bf16 GEMM kernel kern, its
// products packed and split however small.
func bf16Engine(threads int, kern *bf16Kernel) *Engine {
	e := newEngine(threads, goKernel())
	e.bf = kern
	e.minParallel, e.minPacked = 0, 0
	return e
}

// bf16TestKernels is every bf16 kernel the CPU runs, and each that has a
// narrow one once more without it, so that its own tile runs on every
// shape.
func bf16TestKernels() []*bf16Kernel {
	var ks []*bf16Kernel
	for _, k := range bf16KernelsForCPU() {
		ks = append(ks, k)
		if k.narrow != nil {
			alone := *k
			alone.name, alone.narrow = k.name+"-alone", nil
			ks = append(ks, &alone, k.narrow)
		}
	}
	return ks
}

// TestMatMulBF16MatchesReference: every bf16 kernel on 1 to 3 goroutines
// computes the fp32 product of the bf16-rounded inputs, up to the order
// of the fp32 sums; the same bits whatever the number of goroutines; and
// the portable kernel the same bits as the assembly one, whose order of
// sums it copies.
func TestMatMulBF16MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	shapes := append(testShapes, shape{200, 70, 1100}, shape{13, 3200, 40}, shape{150, 16, 1100}, shape{64, 16, 64})
	for _, s := range shapes {
		a, b := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n)
		c0 := randSlice(r, s.m*s.n)
		for _, op := range []struct{ transA, transB, acc bool }{
			{false, false, false}, {true, false, false}, {false, true, false}, {true, true, true},
		} {
			want := append([]float32(nil), c0...)
			naiveMatMul(want, roundedBF16(a), roundedBF16(b), s.m, s.n, s.k, op.transA, op.transB, op.acc)
			var first []float32
			for _, kern := range bf16TestKernels() {
				for _, threads := range []int{1, 3} {
					name := fmt.Sprintf("%dx%dx%d/ta=%v,tb=%v,acc=%v/%s/t%d", s.m, s.n, s.k, op.transA, op.transB, op.acc, kern.name, threads)
					t.Run(name, func(t *testing.T) {
						got := append([]float32(nil), c0...)
						bf16Engine(threads, kern).MatMul(got, a, b, s.m, s.n, s.k, op.transA, op.transB, op.acc)
						requireClose(t, want, got, s.k)
						if first == nil {
							first = got
							return
						}
						require.Equal(t, first, got, "every kernel and split: the same bits")
					})
				}
			}
		}
	}
}

// TestMatMulBF16RoundsInputs: a product whose fp32 inputs differ from
// their bf16 roundings gives the product of the roundings.
func TestMatMulBF16RoundsInputs(t *testing.T) {
	x := math.Float32frombits(0x3f808001) // 1 + 2^-8 + 2^-23: bf16 1 + 2^-7
	for _, kern := range bf16KernelsForCPU() {
		c := make([]float32, 1)
		bf16Engine(1, kern).MatMul(c, []float32{x, x}, []float32{1, 1}, 1, 1, 2, false, false, false)
		require.Equal(t, float32(2+2.0/128), c[0], kern.name)
	}
}

// TestWithPrecision checks that an Engine's precision chooses the GEMM
// kernel and survives WithThreads, and that bf16 kernels are chosen by
// name.
func TestWithPrecision(t *testing.T) {
	e := New(2)
	require.Equal(t, FP32, e.Precision())
	bf := e.WithPrecision(BF16)
	require.Equal(t, BF16, bf.Precision())
	require.Equal(t, AvailableBF16()[0], bf.Kernel())
	require.Equal(t, 2, bf.Threads())
	require.Equal(t, BF16, bf.WithThreads(1).Precision())
	require.Equal(t, FP32, bf.WithPrecision(FP32).Precision())
	require.Equal(t, e.Kernel(), bf.WithPrecision(FP32).Kernel())

	avail := AvailableBF16()
	require.Equal(t, "go-bf16-6x16", avail[len(avail)-1])
	for _, name := range avail {
		e, err := NewWithKernel(1, name)
		require.NoError(t, err)
		require.Equal(t, name, e.Kernel())
		require.Equal(t, BF16, e.Precision())
	}
}

func TestPeakBF16(t *testing.T) {
	for _, kern := range bf16KernelsForCPU() {
		e := bf16Engine(1, kern)
		require.Positive(t, e.MeasurePeak(), kern.name)
		require.Positive(t, e.PeakGFLOPS(10e6), kern.name)
	}
}

// specialFloats is n random floats of every kind the bf16 rounding treats
// apart: ordinary values and ties of both signs, subnormals, zeros,
// infinities, NaNs with payloads high and low, and values that round up
// to infinity.
func specialFloats(r *rand.Rand, n int) []float32 {
	kinds := []func() uint32{
		func() uint32 { return math.Float32bits(r.Float32()*8 - 4) },
		func() uint32 { return r.Uint32()&0xffff0000 | 0x8000 },                         // a tie
		func() uint32 { return r.Uint32() & 0x807fffff },                                // subnormal or zero
		func() uint32 { return r.Uint32()&0x80000000 | 0x7f800000 },                     // infinity
		func() uint32 { return 0x7f800000 | r.Uint32()&0x807fffff | 1 },                 // NaN
		func() uint32 { return r.Uint32()&0x80000000 | 0x7f7f8000 | r.Uint32()&0x7fff }, // to infinity
		func() uint32 { return r.Uint32() },
	}
	s := make([]float32, n)
	for i := range s {
		s[i] = math.Float32frombits(kinds[r.IntN(len(kinds))]())
	}
	return s
}

// TestPackBF16MatchesPortable: every bf16 kernel's packers write the same
// bits as the portable packRowPairs and packColPairs, for full and edge
// panels, odd and even kc, on every kind of float.
func TestPackBF16MatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, kern := range bf16TestKernels() {
		for _, w := range []int{kern.mr, kern.nr} {
			for _, used := range []int{w, w - 1, 1} {
				for _, kc := range []int{1, 2, 7, 16, 17, 31, 32, 33, 48, 64, 128, 161, 512} {
					name := fmt.Sprintf("%s/w%d/used%d/kc%d", kern.name, w, used, kc)
					t.Run(name, func(t *testing.T) {
						pairs := ceilDiv(kc, 2)
						rowsLd, colsLd := kc+3, w+5
						rowSrc := specialFloats(r, (used-1)*rowsLd+kc)
						colSrc := specialFloats(r, (kc-1)*colsLd+used)

						want, got := garbage(w*pairs), garbage(w*pairs)
						packRowPairs(want, rowSrc, rowsLd, used, w, kc)
						kern.packRows(got, rowSrc, rowsLd, used, w, kc, make([]uint32, w*pairs))
						require.Equal(t, want, got, "packRows")

						want, got = garbage(w*pairs), garbage(w*pairs)
						packColPairs(want, colSrc, colsLd, used, w, kc)
						kern.packCols(got, colSrc, colsLd, used, w, kc)
						require.Equal(t, want, got, "packCols")
					})
				}
			}
		}
	}
}

// garbage is n uint32 that no packer writes, so a skipped entry shows.
func garbage(n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = 0xdeadbeef
	}
	return s
}
