package kernels

import (
	"fmt"
	"math"
	"unsafe"
)

// Precision is the number format the Engine's matrix products take their
// inputs in. Whatever it is, they accumulate and write fp32, and every
// other kernel of the Engine (layer norm, softmax, GELU, ...) is fp32.
type Precision int

const (
	// FP32 multiplies the fp32 inputs as they are.
	FP32 Precision = iota
	// BF16 rounds both inputs of a product to bfloat16 (round to nearest
	// even; subnormals to zero, as VDPBF16PS reads them) and sums the
	// products in fp32: the GEMMs of mixed-precision training.
	BF16
)

// String is the name train.toml uses: "fp32" or "bf16".
func (p Precision) String() string {
	switch p {
	case FP32:
		return "fp32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("Precision(%d)", int(p))
}

// ParsePrecision returns the Precision named s ("fp32" or "bf16"), or an
// error naming both.
func ParsePrecision(s string) (Precision, error) {
	for _, p := range []Precision{FP32, BF16} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("kernels: precision %q: want fp32 or bf16", s)
}

// bf16Kernel is a register-tile GEMM kernel on bf16 pairs: panels hold
// one uint32 per row (of op(A)) or column (of op(B)) and pair of k, the
// even k in its low 16 bits, and the tile sums the products in fp32.
type bf16Kernel struct {
	name string
	// mr×nr is the tile of C one call computes; mc×kc and kc×nc the
	// blocks of op(A) and op(B) packed at a time, kc even (counted in k,
	// not pairs).
	mr, nr, mc, kc, nc int
	// tile computes the mr×nr tile of C at c (row stride ldc) from a,
	// pairs packed groups of mr pairs, and b, pairs groups of nr; it adds
	// to the tile when accum and overwrites it otherwise.
	tile func(pairs int, a, b []uint32, c []float32, ldc int, accum bool)
	// packRows packs rows ≤ w rows of kc k at src as packRowPairs does;
	// scratch has room for w×⌈kc/2⌉ pairs.
	packRows func(dst []uint32, src []float32, ld, rows, w, kc int, scratch []uint32)
	// packCols packs cols ≤ w columns of kc k at src as packColPairs
	// does.
	packCols func(dst []uint32, src []float32, ld, cols, w, kc int)
	// peak runs rounds of a register-only multiply-add loop with the
	// kernel's instructions and returns the flops it did.
	peak func(rounds int) int
	// narrow, when not nil, runs the products of at most narrow.nr
	// columns, with the same bits.
	narrow *bf16Kernel
}

// goBF16Kernel is the portable bf16 kernel: the products of the rounded
// inputs in fp32, in VDPBF16PS's order, slowly.
func goBF16Kernel() *bf16Kernel {
	return &bf16Kernel{name: "go-bf16-6x16", mr: 6, nr: 16, mc: 96, kc: 512, nc: 3072, tile: goTileBF16,
		packRows: goPackRows, packCols: packColPairs, peak: goPeak}
}

// WithPrecision returns an Engine with e's threads and fp32 kernels whose
// matrix products take their inputs in p, sharing only its threads with e. For
// BF16 it uses the fastest bf16 kernel this CPU runs: AVX512_BF16 where
// present, else the portable one, which gives the same results much more
// slowly.
func (e *Engine) WithPrecision(p Precision) *Engine {
	n := newEngine(e.threads, e.kern)
	n.team = e.team // one set of threads: products of both precisions do not compete for the cores
	if p == BF16 {
		n.bf = bf16KernelsForCPU()[0]
	}
	return n
}

// Precision is the format of the inputs of the Engine's matrix products.
func (e *Engine) Precision() Precision {
	if e.bf != nil {
		return BF16
	}
	return FP32
}

// BF16InHardware reports whether this CPU multiplies bf16 in hardware
// (AVX512_BF16); without it bf16 products run on the portable kernel:
// the same bits, many times slower.
func BF16InHardware() bool { return len(bf16KernelsForCPU()) > 1 }

// AvailableBF16 names the bf16 GEMM kernels this CPU runs, the fastest
// first and the portable "go-bf16-6x16" last; NewWithKernel takes them too.
func AvailableBF16() []string {
	var names []string
	for _, k := range bf16KernelsForCPU() {
		names = append(names, k.name)
	}
	return names
}

// roundBF16 is f rounded to bfloat16 (to nearest, ties to even),
// returned as the fp32 bits of that value: the low 16 bits are zero.
// Subnormals become zero of their sign, as VDPBF16PS reads them; NaNs stay
// NaN.
func roundBF16(f float32) uint32 {
	b := math.Float32bits(f)
	if e := b & 0x7f800000; e == 0 || e == 0x7f800000 {
		return roundSpecialBF16(b)
	}
	return (b + 0x7fff + (b>>16)&1) & 0xffff0000
}

// roundSpecialBF16 is roundBF16 of the fp32 bits b of a zero, subnormal,
// infinity or NaN.
func roundSpecialBF16(b uint32) uint32 {
	if b&0x7f800000 == 0 {
		return b & 0x80000000
	}
	if b&0x007fffff != 0 {
		return (b | 0x00400000) & 0xffff0000
	}
	return b
}

// pairBF16 packs even and odd, rounded to bf16, into one uint32: even in
// the low half, as VDPBF16PS pairs them.
func pairBF16(even, odd float32) uint32 {
	return roundBF16(odd) | roundBF16(even)>>16
}

// goTileBF16 is the tile function of goBF16Kernel: each pair adds the
// product of the odd elements, then of the even ones, to the fp32 sum, as
// Intel's definition of VDPBF16PS does. A product of two bf16 numbers is
// exact in fp32, so only the sums round.
func goTileBF16(pairs int, a, b []uint32, c []float32, ldc int, accum bool) {
	a = a[:pairs*6]
	b = b[:pairs*16]
	_ = c[5*ldc+15]
	lo := func(v uint32) float32 { return math.Float32frombits(v << 16) }
	hi := func(v uint32) float32 { return math.Float32frombits(v & 0xffff0000) }
	for i0 := 0; i0 < 6; i0 += 2 {
		for j0 := 0; j0 < 16; j0 += 4 {
			var acc [2][4]float32
			for p := range pairs {
				for i := range 2 {
					av := a[6*p+i0+i]
					for j := range 4 {
						bv := b[16*p+j0+j]
						acc[i][j] += hi(av) * hi(bv)
						acc[i][j] += lo(av) * lo(bv)
					}
				}
			}
			for i := range 2 {
				row := c[(i0+i)*ldc+j0:][:4]
				for j := range row {
					if accum {
						acc[i][j] += row[j]
					}
					row[j] = acc[i][j]
				}
			}
		}
	}
}

// bf16Bufs are one goroutine's buffers of a bf16 product: packed panels,
// an fp32 edge tile and the packers' scratch.
type bf16Bufs struct {
	pairs   []uint32
	tile    []float32
	scratch []uint32
}

// gemmBF16 is MatMul on bf16 inputs for m, n, k > 0, split over the
// goroutines as gemm does: by blocks of C, so that every element is the
// same sum whatever the number of goroutines.
func (e *Engine) gemmBF16(c, a, b, bias []float32, m, n, k int, transA, transB, acc bool) {
	kern := e.bf
	if kern.narrow != nil && n <= kern.narrow.nr {
		kern = kern.narrow
	}
	e.forBlocks(m, n, k, kern.mr, kern.nr, func(i0, i1, j0, j1 int) {
		e.gemmBlockBF16(kern, c, a, b, bias, m, n, k, i0, i1, j0, j1, transA, transB, acc)
	})
}

// gemmBlockBF16 computes rows i0..i1 and columns j0..j1 of C as gemmBF16
// does, with kern, on the calling goroutine: for each kc×nc block of op(B) and each
// mc×kc block of op(A), both packed as bf16 pairs, the kernel runs over
// the tiles; edge tiles go through a scratch tile. A non-nil bias goes
// into each mc×nc block of C before the first tile that accumulates into
// it, as in gemmBlock.
func (e *Engine) gemmBlockBF16(kern *bf16Kernel, c, a, b, bias []float32, m, n, k, i0, i1, j0, j1 int, transA, transB, acc bool) {
	mr, nr := kern.mr, kern.nr
	maxPairs := ceilDiv(min(k, kern.kc), 2)
	mcMax := min(kern.mc, ceilDiv(i1-i0, mr)*mr)
	ncMax := min(kern.nc, ceilDiv(j1-j0, nr)*nr)
	bSize := ncMax / nr * panelStride(nr, maxPairs)
	aSize := mcMax / mr * panelStride(mr, maxPairs)
	bufs := e.bf16Bufs(aSize+bSize, mr*nr, max(mr, nr)*maxPairs)
	defer e.packBF16.Put(bufs)
	packed := alignedPairs(bufs.pairs, aSize+bSize)
	ap, bp, tile, scratch := packed[:aSize], packed[aSize:], bufs.tile, bufs.scratch

	for jc := j0; jc < j1; jc += kern.nc {
		ncb := min(kern.nc, j1-jc)
		nPanels := ceilDiv(ncb, nr)
		for pc := 0; pc < k; pc += kern.kc {
			kcb := min(kern.kc, k-pc)
			pairs := ceilDiv(kcb, 2)
			accum := acc || pc > 0 || bias != nil
			sa, sb := panelStride(mr, pairs), panelStride(nr, pairs)
			for q := range nPanels {
				j := jc + q*nr
				if transB {
					kern.packRows(bp[q*sb:], b[j*k+pc:], k, min(nr, jc+ncb-j), nr, kcb, scratch)
				} else {
					kern.packCols(bp[q*sb:], b[pc*n+j:], n, min(nr, jc+ncb-j), nr, kcb)
				}
			}
			for ic := i0; ic < i1; ic += kern.mc {
				mcb := min(kern.mc, i1-ic)
				if bias != nil && pc == 0 {
					setRows(c, bias[jc:jc+ncb], ic, ic+mcb, n, jc)
				}
				for q := range ceilDiv(mcb, mr) {
					i := ic + q*mr
					if transA {
						kern.packCols(ap[q*sa:], a[pc*m+i:], m, min(mr, ic+mcb-i), mr, kcb)
					} else {
						kern.packRows(ap[q*sa:], a[i*k+pc:], k, min(mr, ic+mcb-i), mr, kcb, scratch)
					}
				}
				for q := range nPanels {
					j := jc + q*nr
					nrb := min(nr, jc+ncb-j)
					bq := bp[q*sb:][:nr*pairs]
					for ir := 0; ir < mcb; ir += mr {
						i, mrb := ic+ir, min(mr, mcb-ir)
						ar := ap[ir/mr*sa:][:mr*pairs]
						if mrb == mr && nrb == nr {
							kern.tile(pairs, ar, bq, c[i*n+j:], n, accum)
							continue
						}
						kern.tile(pairs, ar, bq, tile, nr, false)
						addTile(c[i*n+j:], n, tile, nr, mrb, nrb, accum)
					}
				}
			}
		}
	}
}

// addTile writes (or adds, when accum) the top-left rows×cols of the
// tile (row stride ts) to c (row stride ldc).
func addTile(c []float32, ldc int, tile []float32, ts, rows, cols int, accum bool) {
	for r := range rows {
		dst, src := c[r*ldc:][:cols], tile[r*ts:][:cols]
		if !accum {
			copy(dst, src)
			continue
		}
		for x := range dst {
			dst[x] += src[x]
		}
	}
}

// packRowPairs packs kc columns of rows ≤ w rows at src (row stride ld)
// as one panel of bf16 pairs: dst[w*(p/2)+r] holds src[r*ld+p] and
// src[r*ld+p+1] for even p; a last odd column pairs with zero, and rows
// past rows are zero.
func packRowPairs(dst []uint32, src []float32, ld, rows, w, kc int) {
	pairs := kc / 2
	dst = dst[:w*ceilDiv(kc, 2)]
	for r := range rows {
		row := src[r*ld:][:kc]
		for p := range pairs {
			dst[w*p+r] = pairBF16(row[2*p], row[2*p+1])
		}
		if kc%2 == 1 {
			dst[w*pairs+r] = pairBF16(row[kc-1], 0)
		}
	}
	clearPanelEdge(dst, rows, w)
}

// goPackRows is the packRows of goBF16Kernel: packRowPairs, no scratch.
func goPackRows(dst []uint32, src []float32, ld, rows, w, kc int, _ []uint32) {
	packRowPairs(dst, src, ld, rows, w, kc)
}

// packColPairs packs cols ≤ w floats of each of kc rows at src (row
// stride ld) as one panel of bf16 pairs: dst[w*(p/2)+r] holds src[p*ld+r]
// and src[(p+1)*ld+r] for even p; a last odd row pairs with zero, and
// entries past cols are zero.
func packColPairs(dst []uint32, src []float32, ld, cols, w, kc int) {
	dst = dst[:w*ceilDiv(kc, 2)]
	for p := 0; p < kc; p += 2 {
		d, even := dst[w*(p/2):][:cols], src[p*ld:][:cols]
		if p+1 == kc {
			for r, v := range even {
				d[r] = pairBF16(v, 0)
			}
			continue
		}
		odd := src[(p+1)*ld:][:cols]
		for r, v := range even {
			d[r] = pairBF16(v, odd[r])
		}
	}
	clearPanelEdge(dst, cols, w)
}

// clearPanelEdge zeroes entries used..w of every group of w in dst.
func clearPanelEdge(dst []uint32, used, w int) {
	if used == w {
		return
	}
	for g := 0; g < len(dst); g += w {
		clear(dst[g+used : g+w])
	}
}

// bf16Bufs returns buffers from the Engine's pool with room for n pairs
// aligned to a cache line, a tile of tile floats and scratch pairs.
func (e *Engine) bf16Bufs(n, tile, scratch int) *bf16Bufs {
	if b, ok := e.packBF16.Get().(*bf16Bufs); ok && len(b.pairs) >= n+16 && len(b.tile) >= tile && len(b.scratch) >= scratch {
		return b
	}
	return &bf16Bufs{pairs: make([]uint32, n+16), tile: make([]float32, tile), scratch: make([]uint32, scratch)}
}

// alignedPairs is aligned for uint32 buffers.
func alignedPairs(buf []uint32, n int) []uint32 {
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))&63) / 4
	if off != 0 {
		off = 16 - off
	}
	return buf[off : off+n]
}
