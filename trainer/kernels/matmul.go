package kernels

import (
	"fmt"
	"sync"
	"unsafe"
)

// parallelWork is the m*n*k below which a product runs on one goroutine:
// starting goroutines and sharing caches would cost more than they give.
const parallelWork = 64 * 64 * 64

// packedWork is the m*n*k below which a product runs as plain loops:
// packing would cost more than it gives.
const packedWork = 512

// Engine runs matrix products on up to Threads goroutines. It is safe for
// concurrent use. Between calls it keeps only packing buffers, in
// sync.Pools the garbage collector may empty.
type Engine struct {
	threads int
	kern    *microKernel
	// minParallel is the m*n*k from which a product uses several
	// goroutines, minPacked the m*n*k from which it packs panels for the
	// micro-kernel; the tests lower them to run small products so too.
	minParallel, minPacked int
	// packB holds buffers for packed blocks of op(B), packA per-goroutine
	// buffers for packed blocks of op(A) and an edge tile.
	packB, packA sync.Pool
	// bf, when not nil, runs the products on bf16 inputs (see BF16);
	// packBF16 holds its per-goroutine buffers.
	bf       *bf16Kernel
	packBF16 sync.Pool
	// team runs the parallel regions when threads > 1 (see team).
	team *team
	// decayed is adamwChunk trues, the decay flags of an AdamW piece that
	// is decayed whole; never written after newEngine.
	decayed []bool
	// aside holds AdamWKeeping's buffers of a chunk of gradients per
	// thread (*[]float32 of threads·adamwChunk).
	aside sync.Pool
}

// New returns an Engine that splits work over threads goroutines
// (at least 1) and uses the fastest micro-kernel the CPU runs.
func New(threads int) *Engine {
	return newEngine(threads, kernelsForCPU()[0])
}

// NewWithKernel is New with the micro-kernel named kernel, one of
// Available(): to measure or test a narrower ISA than the widest the CPU
// has. A bf16 kernel, one of AvailableBF16(), gives a BF16 Engine with
// that GEMM kernel and New's fp32 kernels. It fails when this CPU (or
// build) does not run that kernel.
func NewWithKernel(threads int, kernel string) (*Engine, error) {
	for _, k := range kernelsForCPU() {
		if k.name == kernel {
			return newEngine(threads, k), nil
		}
	}
	for _, k := range bf16KernelsForCPU() {
		if k.name == kernel {
			e := New(threads)
			e.bf = k
			return e, nil
		}
	}
	return nil, fmt.Errorf("kernels: micro-kernel %q: this CPU runs only %v", kernel, append(Available(), AvailableBF16()...))
}

// Available names the micro-kernels this CPU runs, the fastest (widest
// ISA) first and the portable "go-6x16" last.
func Available() []string {
	var names []string
	for _, k := range kernelsForCPU() {
		names = append(names, k.name)
	}
	return names
}

// newEngine returns an Engine with the micro-kernel kern.
func newEngine(threads int, kern *microKernel) *Engine {
	e := &Engine{threads: max(threads, 1), kern: kern, minParallel: parallelWork, minPacked: packedWork,
		decayed: make([]bool, adamwChunk)}
	for i := range e.decayed {
		e.decayed[i] = true
	}
	if e.threads > 1 {
		e.team = newTeam(e.threads)
	}
	return e
}

// WithThreads returns an Engine with e's micro-kernels and precision
// that splits work over threads goroutines (at least 1), sharing nothing
// with e.
func (e *Engine) WithThreads(threads int) *Engine {
	n := newEngine(threads, e.kern)
	n.bf = e.bf
	return n
}

// Threads is the number of goroutines a product may use.
func (e *Engine) Threads() int { return e.threads }

// Kernel names the GEMM micro-kernel the Engine runs, such as
// "avx512-12x32", "avx2-fma-6x16" or the portable "go-6x16", or for a
// BF16 Engine "avx512bf16-12x32" or "go-bf16-6x16".
func (e *Engine) Kernel() string {
	if e.bf != nil {
		return e.bf.name
	}
	return e.kern.name
}

// MatMul computes C = op(A)·op(B), or C += op(A)·op(B) when acc, for
// row-major fp32 matrices. op(A) is m×k: A is stored m×k, or k×m when
// transA. op(B) is k×n: B is stored k×n, or n×k when transB. C is m×n.
// A BF16 Engine rounds the elements of op(A) and op(B) to bf16 first.
// It panics when a dimension is negative or a slice is shorter than its
// shape says: that is a bug in the caller, not bad input.
func (e *Engine) MatMul(c, a, b []float32, m, n, k int, transA, transB, acc bool) {
	e.product(c, a, b, nil, m, n, k, transA, transB, acc)
}

// MatMulBias computes C = op(A)·op(B) + bias as MatMul does, bias (n
// floats) added to every row of C: the same bits as setting every row of
// C to bias and calling MatMul with acc, but each goroutine sets its own
// block of C just before it accumulates into it, while the block is in
// its cache, instead of one pass over all of C first. It panics as MatMul
// does, or when bias is shorter than n.
func (e *Engine) MatMulBias(c, a, b, bias []float32, m, n, k int, transA, transB bool) {
	if n >= 0 && len(bias) < n {
		panic(fmt.Sprintf("kernels: MatMulBias %dx%dx%d with len(bias)=%d", m, n, k, len(bias)))
	}
	e.product(c, a, b, bias[:max(n, 0)], m, n, k, transA, transB, true)
}

// product is MatMul, and with a non-nil bias MatMulBias (acc is then
// true): C is set to the bias before it accumulates.
func (e *Engine) product(c, a, b, bias []float32, m, n, k int, transA, transB, acc bool) {
	if m < 0 || n < 0 || k < 0 || len(a) < m*k || len(b) < k*n || len(c) < m*n {
		panic(fmt.Sprintf("kernels: MatMul %dx%dx%d with len(a)=%d len(b)=%d len(c)=%d", m, n, k, len(a), len(b), len(c)))
	}
	switch {
	case m == 0 || n == 0:
	case k == 0 && bias != nil:
		setRows(c, bias, 0, m, n, 0)
	case k == 0:
		if !acc {
			clear(c[:m*n])
		}
	case e.bf != nil:
		e.gemmBF16(c, a, b, bias, m, n, k, transA, transB, acc)
	case m*n*k < e.minPacked:
		if bias != nil {
			setRows(c, bias, 0, m, n, 0)
		}
		smallMatMul(c, a, b, m, n, k, transA, transB, acc)
	default:
		e.gemm(c, a, b, bias, m, n, k, transA, transB, acc)
	}
}

// setRows sets columns j0..j0+len(bias) of rows i0..i1 of C (n columns)
// to bias.
func setRows(c, bias []float32, i0, i1, n, j0 int) {
	for i := i0; i < i1; i++ {
		copy(c[i*n+j0:][:len(bias)], bias)
	}
}

// smallMatMul is MatMul as plain loops, for products too small to pack:
// each row of C accumulates the rows of op(B) scaled by a row of op(A).
func smallMatMul(c, a, b []float32, m, n, k int, transA, transB, acc bool) {
	if !acc {
		clear(c[:m*n])
	}
	for i := range m {
		ci := c[i*n:][:n]
		for p := range k {
			av := a[i*k+p]
			if transA {
				av = a[p*m+i]
			}
			if transB {
				for j := range ci {
					ci[j] += av * b[j*k+p]
				}
				continue
			}
			for j, bv := range b[p*n:][:n] {
				ci[j] += av * bv
			}
		}
	}
}

// gemm is the packed product behind MatMul for m, n, k > 0. The
// goroutines take disjoint blocks of C (forBlocks: rows, columns or both),
// and each computes its block on its own (gemmBlock): no
// goroutine waits for another's packing, at the cost of packing the
// shared op(B) (or op(A)) once per goroutine. A non-nil bias (n floats)
// is set into each row of C first, as MatMulBias says.
func (e *Engine) gemm(c, a, b, bias []float32, m, n, k int, transA, transB, acc bool) {
	kern := e.kern.forShape(m, n)
	e.forBlocks(m, n, k, kern.mr, kern.nr, func(i0, i1, j0, j1 int) {
		e.gemmBlock(kern, c, a, b, bias, m, n, k, i0, i1, j0, j1, transA, transB, acc)
	})
}

// forBlocks splits an m×n product over k (in tiles of mr×nr) into
// disjoint blocks of C, one per goroutine — by rows, columns or both, as
// split chooses; one goroutine under minParallel — and calls block with
// each block's rows i0..i1 and columns j0..j1. A block never splits k,
// so every element is the same sum whatever the number of goroutines.
func (e *Engine) forBlocks(m, n, k, mr, nr int, block func(i0, i1, j0, j1 int)) {
	threads := e.threads
	if m*n*k < e.minParallel {
		threads = 1
	}
	mPanels, nPanels := ceilDiv(m, mr), ceilDiv(n, nr)
	tm, tn := split(threads, mPanels, nPanels, mr, nr)
	e.run(tm*tn, func(t int) {
		r0, r1 := part(mPanels, tm, t/tn)
		q0, q1 := part(nPanels, tn, t%tn)
		block(r0*mr, min(r1*mr, m), q0*nr, min(q1*nr, n))
	})
}

// gemmBlock computes rows i0..i1 and columns j0..j1 of C as MatMul does,
// with kern, on the calling goroutine: for each kc×nc block of op(B), packed, and
// each mc×kc block of op(A), packed, the micro-kernel runs over the
// tiles; edge tiles go through a scratch tile. A non-nil bias goes into
// each mc×nc block of C before the first tile that accumulates into it.
func (e *Engine) gemmBlock(kern *microKernel, c, a, b, bias []float32, m, n, k, i0, i1, j0, j1 int, transA, transB, acc bool) {
	mr, nr := kern.mr, kern.nr
	kcMax := min(k, kern.kc)
	mcMax := min(kern.mc, ceilDiv(i1-i0, mr)*mr)
	ncMax := min(kern.nc, ceilDiv(j1-j0, nr)*nr)
	bSize := ncMax / nr * panelStride(nr, kcMax)
	aSize := mcMax / mr * panelStride(mr, kcMax)
	bBuf, aBuf := getBuf(&e.packB, bSize), getBuf(&e.packA, aSize+mr*nr)
	defer e.packB.Put(bBuf)
	defer e.packA.Put(aBuf)
	buf := aligned(*aBuf, aSize+mr*nr)
	ap, tile := buf[:aSize], buf[aSize:]
	// direct, when not nil, reads whole panels of op(A) from a, element
	// (i, p) at aOff(i, p) with aStride between rows (or columns of a
	// transposed A); only a last partial panel is packed.
	direct, aStride, aOff := kern.directA(n, transA, m, k)

	for jc := j0; jc < j1; jc += kern.nc {
		ncb := min(kern.nc, j1-jc)
		nPanels := ceilDiv(ncb, nr)
		for pc := 0; pc < k; pc += kern.kc {
			kcb := min(kern.kc, k-pc)
			accum := acc || pc > 0 || bias != nil
			sa, sb := panelStride(mr, kcb), panelStride(nr, kcb)
			bp := aligned(*bBuf, nPanels*sb)
			kern.packB(bp, b, n, k, pc, kcb, jc, ncb, sb, transB)
			for ic := i0; ic < i1; ic += kern.mc {
				mcb := min(kern.mc, i1-ic)
				if bias != nil && pc == 0 {
					setRows(c, bias[jc:jc+ncb], ic, ic+mcb, n, jc)
				}
				if direct == nil {
					kern.packA(ap, a, m, k, ic, mcb, pc, kcb, sa, transA)
				} else {
					kern.packAEdge(ap, a, m, k, ic, mcb, pc, kcb, sa, transA)
				}
				for q := range nPanels {
					j := jc + q*nr
					nrb := min(nr, jc+ncb-j)
					bq := bp[q*sb:][:nr*kcb]
					for ir := 0; ir < mcb; ir += mr {
						i, mrb := ic+ir, min(mr, mcb-ir)
						ar := ap[ir/mr*sa:][:mr*kcb]
						switch {
						case direct != nil && mrb == mr && nrb == nr:
							direct(kcb, a[aOff(i, pc):], aStride, bq, c[i*n+j:], n, accum)
							continue
						case direct != nil && mrb == mr:
							direct(kcb, a[aOff(i, pc):], aStride, bq, tile, nr, false)
						case mrb == mr && nrb == nr:
							kern.tile(kcb, ar, bq, c[i*n+j:], n, accum)
							continue
						default:
							kern.tile(kcb, ar, bq, tile, nr, false)
						}
						for r := range mrb {
							dst, src := c[(i+r)*n+j:][:nrb], tile[r*nr:][:nrb]
							if !accum {
								copy(dst, src)
								continue
							}
							for x := range dst {
								dst[x] += src[x]
							}
						}
					}
				}
			}
		}
	}
}

// forShape is the micro-kernel for an m×n product: kern, or its narrow
// alternative when that pads C to at most 2/3 as many elements (an
// attention head of 16 columns fills half of a 32-wide tile and all of a
// 16-wide one). The margin is for CPUs whose wide kernel does more flops
// a cycle than the narrow one, which this choice does not measure.
func (kern *microKernel) forShape(m, n int) *microKernel {
	padded := func(k *microKernel) int { return ceilDiv(m, k.mr) * k.mr * ceilDiv(n, k.nr) * k.nr }
	if kern.narrow != nil && 3*padded(kern.narrow) <= 2*padded(kern) {
		return kern.narrow
	}
	return kern
}

// panelStride is how many floats apart packed panels of w×kc floats lie:
// whole cache lines, an odd number of them, so the panels a packing
// routine writes side by side do not all fall into the same cache sets.
func panelStride(w, kc int) int {
	return (ceilDiv(w*kc, 16) | 1) * 16
}

// directMaxPanels is the most column panels of C (n/nr) for which the
// micro-kernel reads op(A) unpacked: packing a panel of op(A) costs
// about as much as a few tiles, so it pays only when many use it.
const directMaxPanels = 16

// directA returns the tile function that reads op(A) straight from a for
// an m×n×k product, with the stride and offset of op(A)'s elements, or a
// nil function when this product packs op(A).
func (kern *microKernel) directA(n int, transA bool, m, k int) (tile func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool), stride int, off func(i, p int) int) {
	if ceilDiv(n, kern.nr) > directMaxPanels {
		return nil, 0, nil
	}
	if transA && kern.tileCols != nil {
		return kern.tileCols, m, func(i, p int) int { return p*m + i }
	}
	if !transA && kern.tileRows != nil {
		return kern.tileRows, k, func(i, p int) int { return i*k + p }
	}
	return nil, 0, nil
}

// packA packs rows ic..ic+mcb and columns pc..pc+kcb of op(A) into dst
// as panels of mr rows, stride floats apart, each kcb columns of mr
// floats; rows past mcb in the last panel are zero.
func (kern *microKernel) packA(dst, a []float32, m, k, ic, mcb, pc, kcb, stride int, transA bool) {
	mr := kern.mr
	full := mcb / mr
	if transA {
		// op(A)[i, p] = a[p*m+i]: a row of a holds a column of every panel.
		kern.packCopy(dst, a[pc*m+ic:], mr, m, kcb, full, stride)
	} else {
		for q := range full {
			i := ic + q*mr
			kern.packTranspose(dst[q*stride:], a[i*k+pc:], mr, k, kcb)
		}
	}
	kern.packAEdge(dst, a, m, k, ic, mcb, pc, kcb, stride, transA)
}

// packAEdge packs the last mcb mod mr rows of the block packA packs, if
// any, as packA does: into the panel after the whole ones, rows past mcb
// zero.
func (kern *microKernel) packAEdge(dst, a []float32, m, k, ic, mcb, pc, kcb, stride int, transA bool) {
	mr := kern.mr
	full := mcb / mr
	rows := mcb - full*mr
	if rows == 0 {
		return
	}
	d, i := dst[full*stride:][:mr*kcb], ic+full*mr
	clear(d)
	for r := range rows {
		for p := range kcb {
			if transA {
				d[p*mr+r] = a[(pc+p)*m+i+r]
			} else {
				d[p*mr+r] = a[(i+r)*k+pc+p]
			}
		}
	}
}

// packB packs rows pc..pc+kcb and columns j..j+cols of op(B) into dst
// as panels of nr columns, stride floats apart, each kcb rows of nr
// floats; columns past cols in the last panel are zero.
func (kern *microKernel) packB(dst, b []float32, n, k, pc, kcb, j, cols, stride int, transB bool) {
	nr := kern.nr
	full := cols / nr
	if transB {
		// op(B)[p, j] = b[j*k+p]: each packed column is a contiguous run of b.
		for q := range full {
			kern.packTranspose(dst[q*stride:], b[(j+q*nr)*k+pc:], nr, k, kcb)
		}
	} else {
		kern.packCopy(dst, b[pc*n+j:], nr, n, kcb, full, stride)
	}
	last := cols - full*nr
	if last == 0 {
		return
	}
	d, jl := dst[full*stride:][:nr*kcb], j+full*nr
	clear(d)
	for c := range last {
		for p := range kcb {
			if transB {
				d[p*nr+c] = b[(jl+c)*k+pc+p]
			} else {
				d[p*nr+c] = b[(pc+p)*n+jl+c]
			}
		}
	}
}

// split chooses tm×tn ≤ threads goroutines over mPanels row panels of mr
// rows and nPanels column panels of nr columns so the costliest
// goroutine's share is least: its multiply-adds, and readCost for each
// element of op(A) and op(B) it reads (a goroutine reads the rows of op(A)
// and the columns of op(B) of its block, the k dimension alike for both).
// On a tie it prefers row splits, which keep the micro-kernel's rows of C
// apart.
func split(threads, mPanels, nPanels, mr, nr int) (tm, tn int) {
	best := -1
	for m := threads; m >= 1; m-- {
		n := threads / m
		rows, cols := ceilDiv(mPanels, m)*mr, ceilDiv(nPanels, n)*nr
		if cost := rows*cols + readCost*(rows+cols); best < 0 || cost < best {
			best, tm, tn = cost, min(m, mPanels), min(n, nPanels)
		}
	}
	return tm, tn
}

// readCost is what reading an element of op(A) or op(B) costs a goroutine
// in multiply-adds: the inputs of a product usually come from the L3
// cache or memory (the pass before wrote them, on other cores too), and a
// split that has every goroutine read all of a large op(A) to save a
// row of tiles loses more than it saves.
const readCost = 8

// part is the range of the t-th of parts near-equal parts of 0..total.
func part(total, parts, t int) (lo, hi int) {
	return t * total / parts, (t + 1) * total / parts
}

// getBuf returns a buffer from pool with room for n floats aligned to a
// cache line, allocating one when the pool has none that big.
func getBuf(pool *sync.Pool, n int) *[]float32 {
	if p, ok := pool.Get().(*[]float32); ok && len(*p) >= n+16 {
		return p
	}
	s := make([]float32, n+16)
	return &s
}

// aligned returns n floats of buf starting at a 64-byte boundary; buf
// has 16 floats of slack for that.
func aligned(buf []float32, n int) []float32 {
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))&63) / 4
	if off != 0 {
		off = 16 - off
	}
	return buf[off : off+n]
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// naiveMatMul is the reference every faster path is tested against.
func naiveMatMul(c, a, b []float32, m, n, k int, transA, transB, acc bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				av := a[i*k+p]
				if transA {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if transB {
					bv = b[j*k+p]
				}
				s += av * bv
			}
			if acc {
				c[i*n+j] += s
			} else {
				c[i*n+j] = s
			}
		}
	}
}
