// Command gen writes the amd64 assembly of package kernels and its Go
// declarations with avo: the 6×16 AVX2/FMA GEMM micro-kernel and the FMA
// loop that measures the machine's peak. Run it with go generate in
// trainer/kernels; its output is committed as source.
package main

import (
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
