// Command gen writes the amd64 assembly of package kernels and its Go
// declarations with avo: the 6×16 AVX2/FMA GEMM micro-kernel, the
// routines that pack panels for it, and the FMA loop that measures the
// machine's peak. Run it with go generate in
// trainer/kernels; its output is committed as source.
package main

import (
	"flag"
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
	set := flag.String("set", "gemm", "the assembly to write: gemm (sgemm_amd64.s), optim (adamw_amd64.s) or softmax (softmax_amd64.s)")
	flag.Parse()
	ConstraintExpr("amd64,!purego")
	if *set == "optim" {
		adamwKernels()
		Generate()
		return
	}
	if *set == "softmax" {
		softmaxKernels()
		Generate()
		return
	}
	for _, layout := range []aLayout{aPacked, aColumns, aRows} {
		tileKernel(avx2Tile, layout)
	}
	fmaLoop()
	transpose6()
	transpose16()
	copyPanels(6)
	copyPanels(16)
	for _, layout := range []aLayout{aPacked, aColumns, aRows} {
		tileKernel(avx512Tile, layout)
	}
	fmaLoop512()
	transposeWide(12)
	transposeWide(32)
	copyPanels(12)
	copyPanels(32)
	vecMath()
	tileKernel(bf16Tile, aPacked)
	tileKernel(bf16NarrowTile, aPacked)
	dotLoopBF16()
	cvtPairsBF16()
	interleave := interleaveWords()
	packColsBF16(12, interleave)
	packColsBF16(16, interleave)
	packColsBF16(32, interleave)
	Generate()
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

// aLayout is where a micro-kernel reads its mr rows of op(A): from a
// packed panel, or straight from the matrix (no packing).
type aLayout int

const (
	// aPacked: kc groups of mr floats, op(A)[i, p] at a[mr*p+i].
	aPacked aLayout = iota
	// aColumns: op(A)[i, p] at a[p*as+i], A stored transposed (k×m).
	aColumns
	// aRows: op(A)[i, p] at a[i*as+p], A stored as is (m×k).
	aRows
)

// tileSpec is the shape and registers of one micro-kernel: an mr×(nvec·
// lanes) tile of C in mr·nvec accumulators, a row of the b panel in nvec
// registers, broadcasts of a in the rest, used in rotation.
type tileSpec struct {
	name  string // of the packed variant; the others add Cols and Rows
	mr    int
	nvec  int
	lanes int
	regs  []VecPhysical // accumulators, then the row of b, then broadcasts
	zero  func(r VecPhysical)
	// madd emits acc += b·x, lane by lane; nil is VFMADD231PS.
	madd func(b, x, acc VecPhysical)
	// pairs: a and b hold bf16 pairs (uint32) and a step is two of k.
	pairs bool
}

var (
	avx2Tile = tileSpec{name: "kernelAVX2", mr: mr, nvec: 2, lanes: 8,
		regs: []VecPhysical{Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7, Y8, Y9, Y10, Y11, Y12, Y13, Y14, Y15},
		zero: func(r VecPhysical) { VXORPS(r, r, r) }}
	avx512Tile = tileSpec{name: "kernelAVX512", mr: mr512, nvec: 2, lanes: 16,
		regs: []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
			Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23, Z24, Z25, Z26, Z27, Z28, Z29, Z30, Z31},
		zero: func(r VecPhysical) { VPXORD(r, r, r) }}
)

// tileKernel emits the micro-kernel of spec reading op(A) as layout
// says: C[0:mr, 0:nr] = (or +=) A·B over kc steps, b holding kc packed
// groups of nr floats.
func tileKernel(spec tileSpec, layout aLayout) {
	mr, nr := spec.mr, spec.nvec*spec.lanes
	vecBytes := 4 * spec.lanes
	tile := fmt.Sprintf("%d×%d", mr, nr)
	switch layout {
	case aPacked:
		if spec.pairs {
			TEXT(spec.name, NOSPLIT, "func(kc int, a, b *uint32, c *float32, ldc int, accum int)")
			Doc(
				fmt.Sprintf("%s computes the %s fp32 tile at c (row stride ldc floats) as the", spec.name, tile),
				fmt.Sprintf("product of the packed panels a (kc pairs × %d) and b (kc pairs × %d) of bf16", mr, nr),
				"pairs, the even k in the low half of each uint32; it adds the product to",
				"the tile when accum != 0 and overwrites it otherwise. It needs AVX512_BF16.",
			)
			break
		}
		TEXT(spec.name, NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int)")
		Doc(
			fmt.Sprintf("%s computes the %s tile at c (row stride ldc floats) as the", spec.name, tile),
			fmt.Sprintf("product of the packed kc×%d panel a and the packed kc×%d panel b; it", mr, nr),
			"adds the product to the tile when accum != 0 and overwrites it otherwise.",
		)
	case aColumns:
		TEXT(spec.name+"Cols", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int, as int)")
		Doc(
			fmt.Sprintf("%sCols is %s with the %d rows of op(A) read from a", spec.name, spec.name, mr),
			"transposed A: op(A)[i, p] = a[p*as+i].",
		)
	case aRows:
		TEXT(spec.name+"Rows", NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accum int, as int)")
		Doc(
			fmt.Sprintf("%sRows is %s with the %d rows of op(A) read from A", spec.name, spec.name, mr),
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
		rowBase = []GPVirtual{a}
		as3 := GP64()
		LEAQ(Mem{Base: as, Index: as, Scale: 2}, as3)
		for g := 1; g < mr/3; g++ {
			rowBase = append(rowBase, GP64())
			LEAQ(Mem{Base: rowBase[g-1], Index: as3, Scale: 1}, rowBase[g])
		}
	}
	aAt := func(u, i int) Mem {
		switch layout {
		case aPacked:
			return Mem{Base: a, Disp: 4 * (mr*u + i)}
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
			ADDQ(U32(4*mr*steps), a)
		case aColumns:
			// Done after every step, in step.
		default:
			for _, r := range rowBase {
				ADDQ(U8(4*steps), r)
			}
		}
	}

	acc := spec.regs[:mr*spec.nvec]
	bv := spec.regs[mr*spec.nvec : (mr+1)*spec.nvec]
	bc := spec.regs[(mr+1)*spec.nvec:]
	for _, r := range acc {
		spec.zero(r)
	}
	// Touch the rows of the tile so they arrive while the loop runs.
	row := GP64()
	MOVQ(c, row)
	for i := 0; i < mr; i++ {
		PREFETCHT0(Mem{Base: row})
		PREFETCHT0(Mem{Base: row, Disp: 4*nr - 4})
		if i < mr-1 {
			ADDQ(ldc, row)
		}
	}

	step := func(u int) {
		for v, r := range bv {
			VMOVUPS(Mem{Base: b, Disp: 4*nr*u + vecBytes*v}, r)
		}
		for i := 0; i < mr; i++ {
			x := bc[i%len(bc)]
			VBROADCASTSS(aAt(u, i), x)
			for v, r := range bv {
				if spec.madd != nil {
					spec.madd(r, x, acc[spec.nvec*i+v])
				} else {
					VFMADD231PS(r, x, acc[spec.nvec*i+v])
				}
			}
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
	ADDQ(U32(4*nr*unroll), b)
	SUBQ(U8(unroll), kc)
	JMP(LabelRef("loop"))

	Label("tail")
	TESTQ(kc, kc)
	JE(LabelRef("done"))
	step(0)
	advance(1)
	ADDQ(U32(4*nr), b)
	DECQ(kc)
	JMP(LabelRef("tail"))

	Label("done")
	accum := Load(Param("accum"), GP64())
	TESTQ(accum, accum)
	JE(LabelRef("store"))
	MOVQ(c, row)
	for i := 0; i < mr; i++ {
		for v := 0; v < spec.nvec; v++ {
			VADDPS(Mem{Base: row, Disp: vecBytes * v}, acc[spec.nvec*i+v], acc[spec.nvec*i+v])
		}
		if i < mr-1 {
			ADDQ(ldc, row)
		}
	}

	Label("store")
	for i := 0; i < mr; i++ {
		for v := 0; v < spec.nvec; v++ {
			VMOVUPS(acc[spec.nvec*i+v], Mem{Base: c, Disp: vecBytes * v})
		}
		if i < mr-1 {
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
	peakLoop512("fmaLoopAVX512", []string{
		"fmaLoopAVX512 runs n rounds of 24 independent 16-wide fused multiply-adds",
		"(768 flops a round) on registers only.",
	}, func(b, x, acc VecPhysical) { VFMADD231PS(b, x, acc) })
}

// peakLoop512 emits the function name(n int) with doc: n rounds of 24
// independent accumulations op(b, x, acc) into Z0..Z23 from Z24 and Z25,
// registers only: the loop a peak is measured with.
func peakLoop512(name string, doc []string, op func(b, x, acc VecPhysical)) {
	TEXT(name, NOSPLIT, "func(n int)")
	Doc(doc...)
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
		op([]VecPhysical{Z24, Z25}[i%2], Z25, r)
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
