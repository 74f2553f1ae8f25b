package kernels

// microKernel is one register-tile GEMM kernel with the cache blocking
// the packed driver uses around it, and the elementwise kernels of the
// same instruction set.
type microKernel struct {
	name string
	// mr×nr is the tile of C one call computes.
	mr, nr int
	// mc×kc is the block of op(A) packed for the L2 cache, kc×nc the
	// block of op(B) packed for L3; mc is a multiple of mr, nc of nr.
	// The fp32 kernels take nc = 1024 (1 MiB at kc = 256): the packed
	// block stays in the Engine's pool between products, so it is part of
	// every trainer worker's resident memory, and 3072 cost 2 MiB more a
	// goroutine for no speed measured (gorun bench gemm on the model's
	// shapes, issue 22's and the bench model's tokens/s).
	mc, kc, nc int
	// tile computes the mr×nr tile of C at c (row stride ldc) from a, kc
	// packed columns of mr floats, and b, kc packed rows of nr floats; it
	// adds to the tile when accum and overwrites it otherwise.
	tile func(kc int, a, b, c []float32, ldc int, accum bool)
	// tileRows, when not nil, is tile reading the mr rows of op(A)
	// straight from A stored m×k: op(A)[i, p] = a[i*as+p]; tileCols
	// likewise from A stored k×m: op(A)[i, p] = a[p*as+i]. They spare
	// the packing of op(A) where it is used by few tiles.
	tileRows, tileCols func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool)
	// packTranspose packs kc columns of w rows at src (row stride ld)
	// as one panel: dst[w*p+r] = src[r*ld+p]. w is mr or nr.
	packTranspose func(dst, src []float32, w, ld, kc int)
	// packCopy packs panels×w floats from each of kc rows at src (row
	// stride ld) as panels stride floats apart, reading each row in
	// order: dst[q*stride+w*p+r] = src[p*ld+q*w+r]. w is mr or nr.
	packCopy func(dst, src []float32, w, ld, kc, panels, stride int)
	// peak runs rounds of a register-only multiply-add loop with the
	// kernel's instructions and returns the flops it did.
	peak func(rounds int) int
	// expSum, gelu, layerNorm, layerNormBackward, max and
	// scale are the Engine's methods of those names with the kernel's
	// instructions, lengths checked by the caller.
	expSum            func(dst, src []float32, scale, shift float32) float32
	gelu              func(out, dgelu, h []float32)
	layerNorm         func(out, mean, rstd, x, w, b []float32, rows, d int, eps float32)
	layerNormBackward func(dx, dw, db, dout, x, mean, rstd, w []float32, rows, d int)
	max               func(x []float32) float32
	scale             func(x []float32, s float32)
	// add, mul and sumRows are the Engine's Add, Mul and SumRows (rows
	// rows of cols floats), lengths checked by the caller.
	add, mul func(dst, src []float32)
	sumRows  func(dst, src []float32, rows, cols int)
	// narrow, when not nil, is a kernel of a smaller tile the GEMM uses
	// instead for products it pads less (see forShape).
	narrow *microKernel
}

// goKernel is the portable micro-kernel: a 6×16 tile computed as 2×4
// sub-tiles whose 8 accumulators stay in registers.
func goKernel() *microKernel {
	return &microKernel{
		name: "go-6x16",
		mr:   6, nr: 16,
		mc: 96, kc: 256, nc: 1024,
		tile:              goTile,
		packTranspose:     goTranspose,
		packCopy:          goCopy,
		peak:              goPeak,
		expSum:            goExpSum,
		gelu:              goGELU,
		layerNorm:         goLayerNorm,
		layerNormBackward: goLayerNormBackward,
		max:               goMax,
		scale:             goScale,
		add:               goAdd,
		mul:               goMul,
		sumRows:           goSumRows,
	}
}

// goTile is the tile function of goKernel.
func goTile(kc int, a, b, c []float32, ldc int, accum bool) {
	a = a[:kc*6]
	b = b[:kc*16]
	_ = c[5*ldc+15]
	for i0 := 0; i0 < 6; i0 += 2 {
		for j0 := 0; j0 < 16; j0 += 4 {
			var c00, c01, c02, c03, c10, c11, c12, c13 float32
			as, bs := a[i0:], b[j0:]
			for p := 0; p < kc; p++ {
				ap := as[6*p : 6*p+2 : 6*p+2]
				bp := bs[16*p : 16*p+4 : 16*p+4]
				a0, a1 := ap[0], ap[1]
				b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
				c00 += a0 * b0
				c01 += a0 * b1
				c02 += a0 * b2
				c03 += a0 * b3
				c10 += a1 * b0
				c11 += a1 * b1
				c12 += a1 * b2
				c13 += a1 * b3
			}
			r0 := c[i0*ldc+j0 : i0*ldc+j0+4 : i0*ldc+j0+4]
			r1 := c[(i0+1)*ldc+j0 : (i0+1)*ldc+j0+4 : (i0+1)*ldc+j0+4]
			if accum {
				c00 += r0[0]
				c01 += r0[1]
				c02 += r0[2]
				c03 += r0[3]
				c10 += r1[0]
				c11 += r1[1]
				c12 += r1[2]
				c13 += r1[3]
			}
			r0[0], r0[1], r0[2], r0[3] = c00, c01, c02, c03
			r1[0], r1[1], r1[2], r1[3] = c10, c11, c12, c13
		}
	}
}

// goTranspose is the packTranspose of goKernel.
func goTranspose(dst, src []float32, w, ld, kc int) {
	dst = dst[:w*kc]
	for r := range w {
		for p, v := range src[r*ld:][:kc] {
			dst[p*w+r] = v
		}
	}
}

// goCopy is the packCopy of goKernel.
func goCopy(dst, src []float32, w, ld, kc, panels, stride int) {
	for p := range kc {
		row := src[p*ld:][:w*panels]
		for q := range panels {
			copy(dst[q*stride+p*w:][:w], row[q*w:])
		}
	}
}

// goPeak is the peak loop of goKernel: 12 independent multiply-add
// chains, 24 flops a round.
func goPeak(rounds int) int {
	x := [12]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	x0, x1, x2, x3, x4, x5 := x[0], x[1], x[2], x[3], x[4], x[5]
	x6, x7, x8, x9, x10, x11 := x[6], x[7], x[8], x[9], x[10], x[11]
	const m, s = 0.999, 1e-3
	for range rounds {
		x0 = x0*m + s
		x1 = x1*m + s
		x2 = x2*m + s
		x3 = x3*m + s
		x4 = x4*m + s
		x5 = x5*m + s
		x6 = x6*m + s
		x7 = x7*m + s
		x8 = x8*m + s
		x9 = x9*m + s
		x10 = x10*m + s
		x11 = x11*m + s
	}
	// The sum keeps the loop live; it is never NaN for these inputs.
	if sum := x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11; sum != sum {
		return 0
	}
	return rounds * 24
}
