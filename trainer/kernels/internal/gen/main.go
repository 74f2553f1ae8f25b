// Command gen writes the amd64 assembly of package kernels and its Go
// declarations with avo: the 6×16 AVX2/FMA GEMM micro-kernel, the
// routines that pack panels for it, and the FMA loop that measures the
// machine's peak. Run it with go generate in
// trainer/kernels; its output is committed as source.
package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Tile shape of the AVX2 micro-kernel: mr rows of C, nr columns (two ymm).
const (
	mr     = 6
	nr     = 16
	unroll = 4
)

func main() {
	ConstraintExpr("amd64,!purego")
	kernel6x16()
	fmaLoop()
	transpose6()
	transpose16()
	copyPanels(6)
	copyPanels(16)
	kernel12x32(aPacked)
	kernel12x32(aColumns)
	kernel12x32(aRows)
	fmaLoop512()
	transposeWide(12)
	transposeWide(32)
	copyPanels(12)
	copyPanels(32)
	vecMath()
	Generate()
}

// kernel6x16 emits kernelAVX2: C[0:6, 0:16] = (or +=) A·B over kc steps
// of packed panels. a holds kc groups of 6 floats (one column of the row
// panel each), b holds kc groups of 16 floats (one row of the column
// panel each). The 12 ymm accumulators Y0..Y11 hold the whole tile.
func kernel6x16() {
	TEXT("kernelAVX2", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int)")
	Doc(
		"kernelAVX2 computes the 6×16 tile at c (row stride ldc floats) as the",
		"product of the packed kc×6 panel a and the packed kc×16 panel b; it",
		"adds the product to the tile when accum != 0 and overwrites it otherwise.",
	)
	kc := Load(Param("kc"), GP64())
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)

	acc := make([]VecPhysical, 2*mr)
	for i := range acc {
		acc[i] = []VecPhysical{Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7, Y8, Y9, Y10, Y11}[i]
		VXORPS(acc[i], acc[i], acc[i])
	}
	// Touch the six rows of the tile so they arrive while the loop runs.
	row := GP64()
	MOVQ(c, row)
	for i := 0; i < mr; i++ {
		PREFETCHT0(Mem{Base: row})
		PREFETCHT0(Mem{Base: row, Disp: 60})
		if i < mr-1 {
			ADDQ(ldc, row)
		}
	}

	b0, b1 := Y12, Y13
	bc := []VecPhysical{Y14, Y15}
	step := func(u int) {
		VMOVUPS(Mem{Base: b, Disp: 4 * nr * u}, b0)
		VMOVUPS(Mem{Base: b, Disp: 4*nr*u + 32}, b1)
		for i := 0; i < mr; i++ {
			x := bc[i%2]
			VBROADCASTSS(Mem{Base: a, Disp: 4 * (mr*u + i)}, x)
			VFMADD231PS(b0, x, acc[2*i])
			VFMADD231PS(b1, x, acc[2*i+1])
		}
	}

	Label("loop")
	CMPQ(kc, U8(unroll))
	JL(LabelRef("tail"))
	for u := 0; u < unroll; u++ {
		step(u)
	}
	ADDQ(U32(4*mr*unroll), a)
	ADDQ(U32(4*nr*unroll), b)
	SUBQ(U8(unroll), kc)
	JMP(LabelRef("loop"))

	Label("tail")
	TESTQ(kc, kc)
	JE(LabelRef("done"))
	step(0)
	ADDQ(U32(4*mr), a)
	ADDQ(U32(4*nr), b)
	DECQ(kc)
	JMP(LabelRef("tail"))

	Label("done")
	accum := Load(Param("accum"), GP64())
	TESTQ(accum, accum)
	JE(LabelRef("store"))
	MOVQ(c, row)
	for i := 0; i < mr; i++ {
		VADDPS(Mem{Base: row}, acc[2*i], acc[2*i])
		VADDPS(Mem{Base: row, Disp: 32}, acc[2*i+1], acc[2*i+1])
		if i < mr-1 {
			ADDQ(ldc, row)
		}
	}

	Label("store")
	for i := 0; i < mr; i++ {
		VMOVUPS(acc[2*i], Mem{Base: c})
		VMOVUPS(acc[2*i+1], Mem{Base: c, Disp: 32})
		if i < mr-1 {
			ADDQ(ldc, c)
		}
	}
	VZEROUPPER()
	RET()
}

// fmaLoop emits fmaLoopAVX2: n rounds of 12 independent 8-wide FMAs held
// in registers, 192 floating-point operations a round, so the rounds run
// at the FMA units' throughput and nothing else.
func fmaLoop() {
	TEXT("fmaLoopAVX2", NOSPLIT, "func(n int)")
	Doc(
		"fmaLoopAVX2 runs n rounds of 12 independent 8-wide fused multiply-adds",
		"(192 flops a round) on registers only.",
	)
	n := Load(Param("n"), GP64())
	acc := []VecPhysical{Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7, Y8, Y9, Y10, Y11}
	for _, r := range acc {
		VXORPS(r, r, r)
	}
	VXORPS(Y12, Y12, Y12)
	VXORPS(Y13, Y13, Y13)
	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	for i, r := range acc {
		VFMADD231PS([]VecPhysical{Y12, Y13}[i%2], Y13, r)
	}
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// transpose6 emits transpose6AVX: it packs a 6-row panel of a row-major
// matrix, blocks×4 columns, as 6 floats per column: dst[6p+r] = src[r*ld+p].
// Each block is a 4×4 transpose of rows 0..3 plus rows 4 and 5 paired.
func transpose6() {
	TEXT("transpose6AVX", NOSPLIT, "func(dst, src *float32, ld int, blocks int)")
	Doc(
		"transpose6AVX packs blocks×4 columns of the six rows at src (row stride",
		"ld floats) into dst, six floats per column: dst[6p+r] = src[r*ld+p].",
	)
	dst := Load(Param("dst"), GP64())
	r0 := Load(Param("src"), GP64())
	ld := Load(Param("ld"), GP64())
	n := Load(Param("blocks"), GP64())
	SHLQ(U8(2), ld)
	ld3 := GP64()
	LEAQ(Mem{Base: ld, Index: ld, Scale: 2}, ld3)
	r3 := GP64()
	LEAQ(Mem{Base: r0, Index: ld3, Scale: 1}, r3)

	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	rows := []Mem{
		{Base: r0}, {Base: r0, Index: ld, Scale: 1}, {Base: r0, Index: ld, Scale: 2},
		{Base: r3}, {Base: r3, Index: ld, Scale: 1}, {Base: r3, Index: ld, Scale: 2},
	}
	x := make([]VecVirtual, 6)
	for i := range x {
		x[i] = XMM()
		VMOVUPS(rows[i], x[i])
	}
	u0, u1, u2, u3 := XMM(), XMM(), XMM(), XMM()
	VUNPCKLPS(x[1], x[0], u0) // r0_0 r1_0 r0_1 r1_1
	VUNPCKHPS(x[1], x[0], u1) // r0_2 r1_2 r0_3 r1_3
	VUNPCKLPS(x[3], x[2], u2)
	VUNPCKHPS(x[3], x[2], u3)
	v0, v1 := XMM(), XMM()
	VUNPCKLPS(x[5], x[4], v0) // r4_0 r5_0 r4_1 r5_1
	VUNPCKHPS(x[5], x[4], v1) // r4_2 r5_2 r4_3 r5_3
	t := []VecVirtual{XMM(), XMM(), XMM(), XMM()}
	VUNPCKLPD(u2, u0, t[0]) // r0_0 r1_0 r2_0 r3_0
	VUNPCKHPD(u2, u0, t[1])
	VUNPCKLPD(u3, u1, t[2])
	VUNPCKHPD(u3, u1, t[3])
	for p := 0; p < 4; p++ {
		VMOVUPS(t[p], Mem{Base: dst, Disp: 24 * p})
		pair := []VecVirtual{v0, v1}[p/2]
		if p%2 == 0 {
			VMOVLPS(pair, Mem{Base: dst, Disp: 24*p + 16})
		} else {
			VMOVHPS(pair, Mem{Base: dst, Disp: 24*p + 16})
		}
	}
	ADDQ(U8(16), r0)
	ADDQ(U8(16), r3)
	ADDQ(U8(96), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	RET()
}

// transpose16 emits transpose16AVX: it packs a 16-row panel, blocks×8
// columns, as 16 floats per column: dst[16p+r] = src[r*ld+p], with two
// 8×8 transposes per block.
func transpose16() {
	TEXT("transpose16AVX", NOSPLIT, "func(dst, src *float32, ld int, blocks int)")
	Doc(
		"transpose16AVX packs blocks×8 columns of the 16 rows at src (row stride",
		"ld floats) into dst, 16 floats per column: dst[16p+r] = src[r*ld+p].",
	)
	dst := Load(Param("dst"), GP64())
	base := GP64()
	Load(Param("src"), base)
	ld := Load(Param("ld"), GP64())
	n := Load(Param("blocks"), GP64())
	SHLQ(U8(2), ld)
	ld3 := GP64()
	LEAQ(Mem{Base: ld, Index: ld, Scale: 2}, ld3)
	// Rows 0, 4, 8 and 12 of the panel; the others are 1, 2 or 3 ld further.
	quad := []GPVirtual{base, GP64(), GP64(), GP64()}
	for q := 1; q < 4; q++ {
		LEAQ(Mem{Base: quad[q-1], Index: ld, Scale: 4}, quad[q])
	}

	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	for half := 0; half < 2; half++ {
		var rows []Mem
		for _, q := range quad[2*half : 2*half+2] {
			rows = append(rows, Mem{Base: q}, Mem{Base: q, Index: ld, Scale: 1}, Mem{Base: q, Index: ld, Scale: 2}, Mem{Base: q, Index: ld3, Scale: 1})
		}
		r := make([]VecVirtual, 8)
		for i := range r {
			r[i] = YMM()
			VMOVUPS(rows[i], r[i])
		}
		t := make([]VecVirtual, 8)
		for i := 0; i < 8; i += 2 {
			t[i], t[i+1] = YMM(), YMM()
			VUNPCKLPS(r[i+1], r[i], t[i])   // ri_0 ri+1_0 ri_1 ri+1_1 | _4 _5
			VUNPCKHPS(r[i+1], r[i], t[i+1]) // ri_2 ri+1_2 ri_3 ri+1_3 | _6 _7
		}
		s := make([]VecVirtual, 8)
		for i, src := range [][2]int{{0, 2}, {0, 2}, {1, 3}, {1, 3}, {4, 6}, {4, 6}, {5, 7}, {5, 7}} {
			s[i] = YMM()
			VSHUFPS(U8([]int{0x44, 0xEE}[i%2]), t[src[1]], t[src[0]], s[i])
		}
		// s[c] holds rows 0..3 of columns c and c+4 (c < 4), s[4+c] rows 4..7.
		for c := 0; c < 4; c++ {
			lo, hi := YMM(), YMM()
			VPERM2F128(U8(0x20), s[4+c], s[c], lo)
			VPERM2F128(U8(0x31), s[4+c], s[c], hi)
			VMOVUPS(lo, Mem{Base: dst, Disp: 64*c + 32*half})
			VMOVUPS(hi, Mem{Base: dst, Disp: 64*(c+4) + 32*half})
		}
	}
	for _, q := range quad {
		ADDQ(U8(32), q)
	}
	ADDQ(U32(512), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// copyPanels emits copy<w>AVX: it packs a block of panels of w columns
// each, row by row: dst[q*stride + w*p + r] = src[p*ld + q*w + r] for
// r < w, p < kc, q < panels, reading each row of src in order.
func copyPanels(w int) {
	name := fmt.Sprintf("copy%dAVX", w)
	TEXT(name, NOSPLIT, "func(dst, src *float32, ld, kc, panels, stride int)")
	Doc(
		fmt.Sprintf("%s packs panels×%d floats from each of kc rows at src (row stride", name, w),
		fmt.Sprintf("ld floats) into panels of kc×%d floats at dst, stride floats apart:", w),
		fmt.Sprintf("dst[q*stride + %d*p + r] = src[p*ld + q*%d + r].", w, w),
	)
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	ld := Load(Param("ld"), GP64())
	kc := Load(Param("kc"), GP64())
	SHLQ(U8(2), ld)
	pstride := Load(Param("stride"), GP64())
	SHLQ(U8(2), pstride)
	s, d, q := GP64(), GP64(), GP64()
	Label("rows")
	TESTQ(kc, kc)
	JE(LabelRef("done"))
	MOVQ(src, s)
	MOVQ(dst, d)
	Load(Param("panels"), q)
	Label("panels")
	TESTQ(q, q)
	JE(LabelRef("next"))
	switch w {
	case 6:
		lo, hi := XMM(), XMM()
		VMOVUPS(Mem{Base: s}, lo)
		VMOVSD(Mem{Base: s, Disp: 16}, hi)
		VMOVUPS(lo, Mem{Base: d})
		VMOVSD(hi, Mem{Base: d, Disp: 16})
	case 12:
		lo, hi := YMM(), XMM()
		VMOVUPS(Mem{Base: s}, lo)
		VMOVUPS(Mem{Base: s, Disp: 32}, hi)
		VMOVUPS(lo, Mem{Base: d})
		VMOVUPS(hi, Mem{Base: d, Disp: 32})
	case 16, 32:
		for off := 0; off < 4*w; off += 64 {
			lo, hi := YMM(), YMM()
			VMOVUPS(Mem{Base: s, Disp: off}, lo)
			VMOVUPS(Mem{Base: s, Disp: off + 32}, hi)
			VMOVUPS(lo, Mem{Base: d, Disp: off})
			VMOVUPS(hi, Mem{Base: d, Disp: off + 32})
		}
	default:
		panic("copyPanels: width must be 6, 12, 16 or 32")
	}
	ADDQ(U32(4*w), s)
	ADDQ(pstride, d)
	DECQ(q)
	JMP(LabelRef("panels"))
	Label("next")
	ADDQ(ld, src)
	ADDQ(U32(4*w), dst)
	DECQ(kc)
	JMP(LabelRef("rows"))
	Label("done")
	VZEROUPPER()
	RET()
}

// Tile shape of the AVX-512 micro-kernel: mr512 rows of C, nr512 columns
// (two zmm). Its 24 accumulators, 2 rows of B and 6 broadcasts of A use
// all 32 zmm registers.
const (
	mr512 = 12
	nr512 = 32
)

// aLayout is where a 12×32 kernel reads its 12 rows of op(A): from a
// packed panel, or straight from the matrix (no packing).
type aLayout int

const (
	// aPacked: kc groups of 12 floats, op(A)[i, p] at a[12p+i].
	aPacked aLayout = iota
	// aColumns: op(A)[i, p] at a[p*as+i], A stored transposed (k×m).
	aColumns
	// aRows: op(A)[i, p] at a[i*as+p], A stored as is (m×k).
	aRows
)

// kernel12x32 emits the AVX-512 12×32 micro-kernel reading op(A) as
// layout says: C[0:12, 0:32] = (or +=) A·B over kc steps, b holding kc
// packed groups of 32 floats; Z0..Z23 hold the tile, Z24 and Z25 a row of
// b, Z26..Z31 broadcasts of a in rotation.
func kernel12x32(layout aLayout) {
	switch layout {
	case aPacked:
		TEXT("kernelAVX512", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int)")
		Doc(
			"kernelAVX512 computes the 12×32 tile at c (row stride ldc floats) as the",
			"product of the packed kc×12 panel a and the packed kc×32 panel b; it",
			"adds the product to the tile when accum != 0 and overwrites it otherwise.",
		)
	case aColumns:
		TEXT("kernelAVX512Cols", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int, as int)")
		Doc(
			"kernelAVX512Cols is kernelAVX512 with the 12 rows of op(A) read from a",
			"transposed A: op(A)[i, p] = a[p*as+i].",
		)
	case aRows:
		TEXT("kernelAVX512Rows", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int, as int)")
		Doc(
			"kernelAVX512Rows is kernelAVX512 with the 12 rows of op(A) read from A",
			"as stored: op(A)[i, p] = a[i*as+p].",
		)
	}
	kc := Load(Param("kc"), GP64())
	a := GP64()
	Load(Param("a"), a)
	b := Load(Param("b"), GP64())
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	var as GPVirtual
	// rowBase[g] points at row 3g of op(A) (aRows): row 3g+j is rowBase[g] + j*as.
	var rowBase []GPVirtual
	if layout != aPacked {
		as = GP64()
		Load(Param("as"), as)
		SHLQ(U8(2), as)
	}
	if layout == aRows {
		rowBase = []GPVirtual{a, GP64(), GP64(), GP64()}
		as3 := GP64()
		LEAQ(Mem{Base: as, Index: as, Scale: 2}, as3)
		for g := 1; g < 4; g++ {
			LEAQ(Mem{Base: rowBase[g-1], Index: as3, Scale: 1}, rowBase[g])
		}
	}
	aAt := func(u, i int) Mem {
		switch layout {
		case aPacked:
			return Mem{Base: a, Disp: 4 * (mr512*u + i)}
		case aColumns:
			return Mem{Base: a, Disp: 4 * i}
		default:
			m := Mem{Base: rowBase[i/3], Disp: 4 * u}
			if i%3 != 0 {
				m.Index, m.Scale = as, uint8(i%3)
			}
			return m
		}
	}
	// advance moves a past steps steps of k.
	advance := func(steps int) {
		switch layout {
		case aPacked:
			ADDQ(U32(4*mr512*steps), a)
		case aColumns:
			// Done after every step, in step.
		default:
			for _, r := range rowBase {
				ADDQ(U8(4*steps), r)
			}
		}
	}

	zmm := []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
		Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23, Z24, Z25, Z26, Z27, Z28, Z29, Z30, Z31}
	acc := zmm[:2*mr512]
	b0, b1 := zmm[24], zmm[25]
	bc := zmm[26:]
	for _, r := range acc {
		VPXORD(r, r, r)
	}
	row := GP64()
	MOVQ(c, row)
	for i := 0; i < mr512; i++ {
		PREFETCHT0(Mem{Base: row})
		PREFETCHT0(Mem{Base: row, Disp: 124})
		if i < mr512-1 {
			ADDQ(ldc, row)
		}
	}

	step := func(u int) {
		VMOVUPS(Mem{Base: b, Disp: 4 * nr512 * u}, b0)
		VMOVUPS(Mem{Base: b, Disp: 4*nr512*u + 64}, b1)
		for i := 0; i < mr512; i++ {
			x := bc[i%len(bc)]
			VBROADCASTSS(aAt(u, i), x)
			VFMADD231PS(b0, x, acc[2*i])
			VFMADD231PS(b1, x, acc[2*i+1])
		}
		if layout == aColumns {
			ADDQ(as, a)
		}
	}

	Label("loop")
	CMPQ(kc, U8(unroll))
	JL(LabelRef("tail"))
	for u := 0; u < unroll; u++ {
		step(u)
	}
	advance(unroll)
	ADDQ(U32(4*nr512*unroll), b)
	SUBQ(U8(unroll), kc)
	JMP(LabelRef("loop"))

	Label("tail")
	TESTQ(kc, kc)
	JE(LabelRef("done"))
	step(0)
	advance(1)
	ADDQ(U32(4*nr512), b)
	DECQ(kc)
	JMP(LabelRef("tail"))

	Label("done")
	accum := Load(Param("accum"), GP64())
	TESTQ(accum, accum)
	JE(LabelRef("store"))
	MOVQ(c, row)
	for i := 0; i < mr512; i++ {
		VADDPS(Mem{Base: row}, acc[2*i], acc[2*i])
		VADDPS(Mem{Base: row, Disp: 64}, acc[2*i+1], acc[2*i+1])
		if i < mr512-1 {
			ADDQ(ldc, row)
		}
	}

	Label("store")
	for i := 0; i < mr512; i++ {
		VMOVUPS(acc[2*i], Mem{Base: c})
		VMOVUPS(acc[2*i+1], Mem{Base: c, Disp: 64})
		if i < mr512-1 {
			ADDQ(ldc, c)
		}
	}
	VZEROUPPER()
	RET()
}

// fmaLoop512 emits fmaLoopAVX512: n rounds of 24 independent 16-wide FMAs
// held in zmm registers, 768 floating-point operations a round: enough
// chains to fill two FMA units of latency 4 and more.
func fmaLoop512() {
	TEXT("fmaLoopAVX512", NOSPLIT, "func(n int)")
	Doc(
		"fmaLoopAVX512 runs n rounds of 24 independent 16-wide fused multiply-adds",
		"(768 flops a round) on registers only.",
	)
	n := Load(Param("n"), GP64())
	acc := []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
		Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23}
	for _, r := range append(acc, Z24, Z25) {
		VPXORD(r, r, r)
	}
	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	for i, r := range acc {
		VFMADD231PS([]VecPhysical{Z24, Z25}[i%2], Z25, r)
	}
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// transposeWide emits transpose<w>AVX for w a multiple of 4: it packs a
// w-row panel, blocks×8 columns, as w floats per column: dst[w*p+r] =
// src[r*ld+p]. Rows go in groups of 8 (an 8×8 transpose in ymm
// registers) and a last group of 4 (two 4×4 transposes in xmm).
func transposeWide(w int) {
	name := fmt.Sprintf("transpose%dAVX", w)
	TEXT(name, NOSPLIT, "func(dst, src *float32, ld int, blocks int)")
	Doc(
		fmt.Sprintf("%s packs blocks×8 columns of the %d rows at src (row stride", name, w),
		fmt.Sprintf("ld floats) into dst, %d floats per column: dst[%d*p+r] = src[r*ld+p].", w, w),
	)
	dst := GP64()
	Load(Param("dst"), dst)
	src := GP64()
	Load(Param("src"), src)
	ld := Load(Param("ld"), GP64())
	n := Load(Param("blocks"), GP64())
	SHLQ(U8(2), ld)
	ld3 := GP64()
	LEAQ(Mem{Base: ld, Index: ld, Scale: 2}, ld3)
	// quad[g] points at row 4g of the panel, at the current block.
	quad := make([]GPVirtual, w/4)
	quad[0] = src
	for g := 1; g < len(quad); g++ {
		quad[g] = GP64()
		LEAQ(Mem{Base: quad[g-1], Index: ld, Scale: 4}, quad[g])
	}
	rowsOf := func(g int) []Mem {
		q := quad[g]
		return []Mem{{Base: q}, {Base: q, Index: ld, Scale: 1}, {Base: q, Index: ld, Scale: 2}, {Base: q, Index: ld3, Scale: 1}}
	}

	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	for g := 0; g+1 < len(quad); g += 2 {
		transpose8x8(append(rowsOf(g), rowsOf(g+1)...), dst, 4*w, 4*4*g)
	}
	if len(quad)%2 == 1 {
		g := len(quad) - 1
		for half := 0; half < 2; half++ {
			rows := rowsOf(g)
			for i := range rows {
				rows[i].Disp = 16 * half
			}
			transpose4x4(rows, dst, 4*w, 4*w*4*half+4*4*g)
		}
	}
	for _, q := range quad {
		ADDQ(U8(32), q)
	}
	ADDQ(U32(4*w*8), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// transpose8x8 loads 8 floats from each of the 8 rows and stores column
// c of them (8 floats) at dst+off+c*colStride bytes.
func transpose8x8(rows []Mem, dst Register, colStride, off int) {
	r := make([]VecVirtual, 8)
	for i := range r {
		r[i] = YMM()
		VMOVUPS(rows[i], r[i])
	}
	t := make([]VecVirtual, 8)
	for i := 0; i < 8; i += 2 {
		t[i], t[i+1] = YMM(), YMM()
		VUNPCKLPS(r[i+1], r[i], t[i])
		VUNPCKHPS(r[i+1], r[i], t[i+1])
	}
	s := make([]VecVirtual, 8)
	for i, src := range [][2]int{{0, 2}, {0, 2}, {1, 3}, {1, 3}, {4, 6}, {4, 6}, {5, 7}, {5, 7}} {
		s[i] = YMM()
		VSHUFPS(U8([]int{0x44, 0xEE}[i%2]), t[src[1]], t[src[0]], s[i])
	}
	for c := 0; c < 4; c++ {
		lo, hi := YMM(), YMM()
		VPERM2F128(U8(0x20), s[4+c], s[c], lo)
		VPERM2F128(U8(0x31), s[4+c], s[c], hi)
		VMOVUPS(lo, Mem{Base: dst, Disp: off + colStride*c})
		VMOVUPS(hi, Mem{Base: dst, Disp: off + colStride*(c+4)})
	}
}

// transpose4x4 loads 4 floats from each of the 4 rows and stores column
// c of them (4 floats) at dst+off+c*colStride bytes.
func transpose4x4(rows []Mem, dst Register, colStride, off int) {
	x := make([]VecVirtual, 4)
	for i := range x {
		x[i] = XMM()
		VMOVUPS(rows[i], x[i])
	}
	u0, u1, u2, u3 := XMM(), XMM(), XMM(), XMM()
	VUNPCKLPS(x[1], x[0], u0)
	VUNPCKHPS(x[1], x[0], u1)
	VUNPCKLPS(x[3], x[2], u2)
	VUNPCKHPS(x[3], x[2], u3)
	t := []VecVirtual{XMM(), XMM(), XMM(), XMM()}
	VUNPCKLPD(u2, u0, t[0])
	VUNPCKHPD(u2, u0, t[1])
	VUNPCKLPD(u3, u1, t[2])
	VUNPCKHPD(u3, u1, t[3])
	for c := range t {
		VMOVUPS(t[c], Mem{Base: dst, Disp: off + colStride*c})
	}
}
