//go:build amd64 && !purego

package kernels

//go:generate go run ./internal/gen -out sgemm_amd64.s -stubs sgemm_amd64_stub.go -pkg kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// avx2Kernel is the 6×16 AVX2/FMA assembly micro-kernel.
func avx2Kernel() *microKernel {
	return &microKernel{
		name: "avx2-fma-6x16",
		mr:   6, nr: 16,
		mc: 144, kc: 256, nc: 1024,
		tile: func(kc int, a, b, c []float32, ldc int, accum bool) {
			// The packed panels hold kc*6 and kc*16 floats and c holds a
			// whole 6×16 tile at stride ldc: the assembly reads no further.
			_ = a[kc*6-1]
			_ = b[kc*16-1]
			_ = c[5*ldc+15]
			kernelAVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum))
		},
		tileRows: func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool) {
			_ = a[5*as+kc-1]
			_ = b[kc*16-1]
			_ = c[5*ldc+15]
			kernelAVX2Rows(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum), as)
		},
		tileCols: func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool) {
			_ = a[(kc-1)*as+5]
			_ = b[kc*16-1]
			_ = c[5*ldc+15]
			kernelAVX2Cols(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum), as)
		},
		packTranspose: avxTranspose,
		packCopy:      avxCopy,
		peak: func(rounds int) int {
			fmaLoopAVX2(rounds)
			return rounds * 192
		},
		expSum:            vecExpSum(expSumAVX2, 8),
		gelu:              vecGELU(geluAVX2, 8),
		layerNorm:         vecLayerNorm(layerNormAVX2, 8),
		layerNormBackward: vecLayerNormBackward(layerNormBackwardAVX2, 8),
		max:               vecMax(maxSumAVX2, 8),
		scale:             vecScale(scaleAVX2, 8),
		add:               vecAdd(addAVX2, 8),
		mul:               vecMul(mulAVX2, 8),
		sumRows:           vecSumRows(sumRowsAVX2, 8),
	}
}

// avx512Kernel is the 12×32 AVX-512 micro-kernel. Its packing routines
// need only AVX, and products narrower than 32 columns run on the AVX2
// kernel: every AVX-512 CPU has both.
func avx512Kernel() *microKernel {
	return &microKernel{
		name: "avx512-12x32",
		mr:   12, nr: 32,
		mc: 144, kc: 256, nc: 1024,
		tile: func(kc int, a, b, c []float32, ldc int, accum bool) {
			// As in avx2Kernel: the assembly reads kc*12 floats of a, kc*32
			// of b and a 12×32 tile of c.
			_ = a[kc*12-1]
			_ = b[kc*32-1]
			_ = c[11*ldc+31]
			kernelAVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum))
		},
		tileRows: func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool) {
			_ = a[11*as+kc-1]
			_ = b[kc*32-1]
			_ = c[11*ldc+31]
			kernelAVX512Rows(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum), as)
		},
		tileCols: func(kc int, a []float32, as int, b, c []float32, ldc int, accum bool) {
			_ = a[(kc-1)*as+11]
			_ = b[kc*32-1]
			_ = c[11*ldc+31]
			kernelAVX512Cols(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum), as)
		},
		packTranspose: avxTranspose,
		packCopy:      avxCopy,
		peak: func(rounds int) int {
			fmaLoopAVX512(rounds)
			return rounds * 768
		},
		expSum:            vecExpSum(expSumAVX512, 16),
		gelu:              vecGELU(geluAVX512, 16),
		layerNorm:         vecLayerNorm(layerNormAVX512, 16),
		layerNormBackward: vecLayerNormBackward(layerNormBackwardAVX512, 16),
		max:               vecMax(maxSumAVX512, 16),
		scale:             vecScale(scaleAVX512, 16),
		add:               vecAdd(addAVX512, 16),
		mul:               vecMul(mulAVX512, 16),
		sumRows:           vecSumRows(sumRowsAVX512, 16),
		narrow:            avx2Kernel(),
	}
}

// hasAVX512 reports whether the CPU and OS run the AVX-512 kernel: it
// uses AVX-512F instructions on zmm registers only.
func hasAVX512() bool { return cpu.X86.HasAVX512F && hasAVX2() }

// hasAVX2 reports whether the CPU and OS run the AVX2/FMA kernel.
func hasAVX2() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }

// kernelsForCPU lists every micro-kernel this CPU runs, fastest first.
func kernelsForCPU() []*microKernel {
	var ks []*microKernel
	if hasAVX512() {
		ks = append(ks, avx512Kernel())
	}
	if hasAVX2() {
		ks = append(ks, avx2Kernel())
	}
	return append(ks, goKernel())
}

// avx512BF16Kernel is the 12×32 AVX512_BF16 GEMM kernel (VDPBF16PS).
func avx512BF16Kernel() *bf16Kernel {
	return &bf16Kernel{
		name: "avx512bf16-12x32",
		mr:   12, nr: 32,
		mc: 144, kc: 512, nc: 3072,
		tile: func(pairs int, a, b []uint32, c []float32, ldc int, accum bool) {
			// The assembly reads pairs*12 pairs of a, pairs*32 of b and a
			// 12×32 tile of c.
			_ = a[pairs*12-1]
			_ = b[pairs*32-1]
			_ = c[11*ldc+31]
			kernelBF16(pairs, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum))
		},
		packRows: avxPackRowPairs,
		packCols: avxPackColPairs,
		peak: func(rounds int) int {
			dotLoopBF16(rounds)
			return rounds * 1536
		},
		narrow: avx512BF16NarrowKernel(),
	}
}

// avx512BF16NarrowKernel is the 12×16 AVX512_BF16 kernel the 12×32 one
// hands products of at most 16 columns to: the same sums in the same
// order, so the same bits.
func avx512BF16NarrowKernel() *bf16Kernel {
	return &bf16Kernel{
		name: "avx512bf16-12x16",
		mr:   12, nr: 16,
		mc: 144, kc: 512, nc: 3072,
		tile: func(pairs int, a, b []uint32, c []float32, ldc int, accum bool) {
			// The assembly reads pairs*12 pairs of a, pairs*16 of b and a
			// 12×16 tile of c.
			_ = a[pairs*12-1]
			_ = b[pairs*16-1]
			_ = c[11*ldc+15]
			kernelBF16Narrow(pairs, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accum))
		},
		packRows: avxPackRowPairs,
		packCols: avxPackColPairs,
		peak: func(rounds int) int {
			dotLoopBF16(rounds)
			return rounds * 1536
		},
	}
}

// hasAVX512BF16 reports whether the CPU and OS run the AVX512_BF16
// kernel: AVX-512F on zmm registers and VDPBF16PS.
func hasAVX512BF16() bool { return hasAVX512() && cpu.X86.HasAVX512BF16 }

// bf16KernelsForCPU lists every bf16 GEMM kernel this CPU runs, fastest
// first.
func bf16KernelsForCPU() []*bf16Kernel {
	if hasAVX512BF16() {
		return []*bf16Kernel{avx512BF16Kernel(), goBF16Kernel()}
	}
	return []*bf16Kernel{goBF16Kernel()}
}

// avxPackRowPairs is packRowPairs with whole panels of 12, 16 and 32 rows
// done in assembly: each row rounded by cvtPairsBF16 into scratch (its
// pairs in order), then the w×⌈kc/2⌉ pairs transposed as avxTranspose
// moves floats. A row's last kc%16 floats round in Go.
func avxPackRowPairs(dst []uint32, src []float32, ld, rows, w, kc int, scratch []uint32) {
	whole := kc / 16 * 16
	if rows != w || (w != 12 && w != 16 && w != 32) || whole == 0 {
		packRowPairs(dst, src, ld, rows, w, kc)
		return
	}
	pairs := ceilDiv(kc, 2)
	s := scratch[:w*pairs]
	for r := range w {
		row, out := src[r*ld:][:kc], s[r*pairs:][:pairs]
		cvtPairsBF16(unsafe.SliceData(out), unsafe.SliceData(row), whole)
		for p := whole / 2; p < kc/2; p++ {
			out[p] = pairBF16(row[2*p], row[2*p+1])
		}
		if kc%2 == 1 {
			out[pairs-1] = pairBF16(row[kc-1], 0)
		}
	}
	avxTranspose(pairsAsFloats(dst[:w*pairs]), pairsAsFloats(s), w, pairs, pairs)
}

// avxPackColPairs is packColPairs with whole panels of 12, 16 and 32
// columns done in assembly (packCols12BF16, packCols16BF16,
// packCols32BF16); a last odd row pairs with zero in Go.
func avxPackColPairs(dst []uint32, src []float32, ld, cols, w, kc int) {
	pairs := kc / 2
	if cols != w || (w != 12 && w != 16 && w != 32) || pairs == 0 {
		packColPairs(dst, src, ld, cols, w, kc)
		return
	}
	_ = dst[w*ceilDiv(kc, 2)-1]
	_ = src[(2*pairs-1)*ld+w-1]
	d, s := unsafe.SliceData(dst), unsafe.SliceData(src)
	switch w {
	case 12:
		packCols12BF16(d, s, ld, pairs)
	case 16:
		packCols16BF16(d, s, ld, pairs)
	default:
		packCols32BF16(d, s, ld, pairs)
	}
	if kc%2 == 1 {
		d, even := dst[w*pairs:][:w], src[(kc-1)*ld:][:w]
		for r, v := range even {
			d[r] = pairBF16(v, 0)
		}
	}
}

// pairsAsFloats is p's memory seen as floats, for routines that only
// move 32-bit values.
func pairsAsFloats(p []uint32) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(p))), len(p))
}

// avxTranspose is goTranspose with whole blocks of columns of 6, 12, 16
// and 32 rows done in assembly.
func avxTranspose(dst, src []float32, w, ld, kc int) {
	done := 0
	switch {
	case w == 6 && kc >= 4:
		blocks := kc / 4
		done = 4 * blocks
		_ = dst[6*done-1]
		_ = src[5*ld+done-1]
		transpose6AVX(unsafe.SliceData(dst), unsafe.SliceData(src), ld, blocks)
	case w == 16 && kc >= 8:
		blocks := kc / 8
		done = 8 * blocks
		_ = dst[16*done-1]
		_ = src[15*ld+done-1]
		transpose16AVX(unsafe.SliceData(dst), unsafe.SliceData(src), ld, blocks)
	case (w == 12 || w == 32) && kc >= 8:
		blocks := kc / 8
		done = 8 * blocks
		_ = dst[w*done-1]
		_ = src[(w-1)*ld+done-1]
		if w == 12 {
			transpose12AVX(unsafe.SliceData(dst), unsafe.SliceData(src), ld, blocks)
		} else {
			transpose32AVX(unsafe.SliceData(dst), unsafe.SliceData(src), ld, blocks)
		}
	}
	if done < kc {
		goTranspose(dst[w*done:], src[done:], w, ld, kc-done)
	}
}

// avxCopy is goCopy with panels 6, 12, 16 and 32 floats wide copied in
// assembly.
func avxCopy(dst, src []float32, w, ld, kc, panels, stride int) {
	if (w != 6 && w != 12 && w != 16 && w != 32) || kc == 0 || panels == 0 || stride < w*kc {
		goCopy(dst, src, w, ld, kc, panels, stride)
		return
	}
	_ = dst[(panels-1)*stride+w*kc-1]
	_ = src[(kc-1)*ld+w*panels-1]
	d, s := unsafe.SliceData(dst), unsafe.SliceData(src)
	switch w {
	case 6:
		copy6AVX(d, s, ld, kc, panels, stride)
	case 12:
		copy12AVX(d, s, ld, kc, panels, stride)
	case 16:
		copy16AVX(d, s, ld, kc, panels, stride)
	default:
		copy32AVX(d, s, ld, kc, panels, stride)
	}
}

// vecExpSum is an expSum that runs asm on the whole vectors of lanes
// floats and goExpSum on the rest.
func vecExpSum(asm func(dst, src *float32, n int, scale, shift float32) float32, lanes int) func(dst, src []float32, scale, shift float32) float32 {
	return func(dst, src []float32, scale, shift float32) float32 {
		n := len(src) / lanes * lanes
		var sum float32
		if n > 0 {
			_ = dst[n-1]
			sum = asm(unsafe.SliceData(dst), unsafe.SliceData(src), n, scale, shift)
		}
		return sum + goExpSum(dst[n:], src[n:], scale, shift)
	}
}

// vecGELU is a gelu that runs asm on the whole vectors of lanes floats
// and goGELU on the rest.
func vecGELU(asm func(out, dgelu, h *float32, n int), lanes int) func(out, dgelu, h []float32) {
	return func(out, dgelu, h []float32) {
		n := len(h) / lanes * lanes
		if n > 0 {
			_, _ = out[n-1], dgelu[n-1]
			asm(unsafe.SliceData(out), unsafe.SliceData(dgelu), unsafe.SliceData(h), n)
		}
		goGELU(out[n:], dgelu[n:], h[n:])
	}
}

// vecLayerNorm is a layerNorm that runs asm when rows are whole vectors
// of lanes floats and goLayerNorm otherwise.
func vecLayerNorm(asm func(out, mean, rstd, x, w, b *float32, rows, d int, invD, eps float32), lanes int) func(out, mean, rstd, x, w, b []float32, rows, d int, eps float32) {
	return func(out, mean, rstd, x, w, b []float32, rows, d int, eps float32) {
		if d%lanes != 0 || rows == 0 {
			goLayerNorm(out, mean, rstd, x, w, b, rows, d, eps)
			return
		}
		_, _, _, _, _, _ = out[rows*d-1], mean[rows-1], rstd[rows-1], x[rows*d-1], w[d-1], b[d-1]
		asm(unsafe.SliceData(out), unsafe.SliceData(mean), unsafe.SliceData(rstd), unsafe.SliceData(x),
			unsafe.SliceData(w), unsafe.SliceData(b), rows, d, 1/float32(d), eps)
	}
}

// vecLayerNormBackward is a layerNormBackward that runs asm when rows are
// whole vectors of lanes floats and goLayerNormBackward otherwise.
func vecLayerNormBackward(asm func(dx, dw, db, dout, x, mean, rstd, w *float32, rows, d int, invD float32), lanes int) func(dx, dw, db, dout, x, mean, rstd, w []float32, rows, d int) {
	return func(dx, dw, db, dout, x, mean, rstd, w []float32, rows, d int) {
		if d%lanes != 0 || rows == 0 {
			goLayerNormBackward(dx, dw, db, dout, x, mean, rstd, w, rows, d)
			return
		}
		_, _, _, _ = dx[rows*d-1], dout[rows*d-1], x[rows*d-1], mean[rows-1]
		_, _, _, _ = rstd[rows-1], w[d-1], dw[d-1], db[d-1]
		asm(unsafe.SliceData(dx), unsafe.SliceData(dw), unsafe.SliceData(db), unsafe.SliceData(dout), unsafe.SliceData(x),
			unsafe.SliceData(mean), unsafe.SliceData(rstd), unsafe.SliceData(w), rows, d, 1/float32(d))
	}
}

// vecMax is a max that runs asm on the whole vectors of lanes floats and
// goMax on the rest, NaN when the asm's sum says it saw one.
func vecMax(asm func(x *float32, n int) (mx, sum float32), lanes int) func(x []float32) float32 {
	return func(x []float32) float32 {
		n := len(x) / lanes * lanes
		if n == 0 {
			return goMax(x)
		}
		mx, sum := asm(unsafe.SliceData(x), n)
		if sum != sum {
			return sum
		}
		return max(mx, goMax(x[n:]))
	}
}

// vecScale is a scale that runs asm on the whole vectors of lanes floats
// and goScale on the rest.
func vecScale(asm func(x *float32, n int, s float32), lanes int) func(x []float32, s float32) {
	return func(x []float32, s float32) {
		n := len(x) / lanes * lanes
		if n > 0 {
			asm(unsafe.SliceData(x), n, s)
		}
		goScale(x[n:], s)
	}
}

// vecAdd is an add that runs asm on the whole vectors of lanes floats and
// goAdd on the rest.
func vecAdd(asm func(dst, src *float32, n int), lanes int) func(dst, src []float32) {
	return func(dst, src []float32) {
		n := len(src) / lanes * lanes
		if n > 0 {
			_ = dst[n-1]
			asm(unsafe.SliceData(dst), unsafe.SliceData(src), n)
		}
		goAdd(dst[n:len(src)], src[n:])
	}
}

// vecMul is a mul that runs asm on the whole vectors of lanes floats and
// goMul on the rest.
func vecMul(asm func(dst, src *float32, n int), lanes int) func(dst, src []float32) {
	return func(dst, src []float32) {
		n := len(src) / lanes * lanes
		if n > 0 {
			_ = dst[n-1]
			asm(unsafe.SliceData(dst), unsafe.SliceData(src), n)
		}
		goMul(dst[n:len(src)], src[n:])
	}
}

// vecSumRows is a sumRows that runs asm on the columns in whole vectors
// of lanes floats and goSumRows on the columns left: each column's sum
// is in row order either way.
func vecSumRows(asm func(dst, src *float32, rows, cols, ld int), lanes int) func(dst, src []float32, rows, cols int) {
	return func(dst, src []float32, rows, cols int) {
		whole := cols / lanes * lanes
		if rows == 0 {
			return
		}
		if whole > 0 {
			_, _ = dst[whole-1], src[(rows-1)*cols+whole-1]
			asm(unsafe.SliceData(dst), unsafe.SliceData(src), rows, whole, cols)
		}
		if whole < cols {
			for i := range rows {
				goAdd(dst[whole:cols], src[i*cols+whole:(i+1)*cols])
			}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
