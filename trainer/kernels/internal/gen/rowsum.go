package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowSum emits the elementwise additions and products of the model's
// residual stream and GELU backward and the bias gradients' column sums
// for every vector width: add<ISA>, mul<ISA> and sumRows<ISA>.
func rowSum() {
	for _, isa := range vecISAs {
		binaryVec(isa, "add", "adds src[i] to dst[i]", VADDPS)
		binaryVec(isa, "mul", "multiplies dst[i] by src[i]", VMULPS)
		sumRowsVec(isa)
	}
}

// binaryVec emits <op><ISA>: dst[i] = dst[i] <op> src[i] for i < n, a
// multiple of the lanes, four vectors a round while there are four; inst
// is the instruction (VADDPS, VMULPS), what says what it does.
func binaryVec(isa vecISA, op, what string, inst func(ops ...Op)) {
	name := op + isa.suffix
	TEXT(name, NOSPLIT, "func(dst, src *float32, n int)")
	Doc(fmt.Sprintf("%s %s for i < n, a multiple of %d.", name, what, isa.lanes))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	const unroll = 4
	vb := 4 * isa.lanes // bytes per vector
	Label("wide")
	CMPQ(n, U32(unroll*isa.lanes))
	JL(LabelRef("one"))
	vs := make([]VecVirtual, unroll)
	for k := range vs {
		vs[k] = isa.vec()
		VMOVUPS(Mem{Base: src, Disp: k * vb}, vs[k])
		inst(Mem{Base: dst, Disp: k * vb}, vs[k], vs[k])
	}
	for k := range vs {
		VMOVUPS(vs[k], Mem{Base: dst, Disp: k * vb})
	}
	ADDQ(U32(unroll*vb), src)
	ADDQ(U32(unroll*vb), dst)
	SUBQ(U32(unroll*isa.lanes), n)
	JMP(LabelRef("wide"))
	Label("one")
	TESTQ(n, n)
	JE(LabelRef("done"))
	v := isa.vec()
	VMOVUPS(Mem{Base: src}, v)
	inst(Mem{Base: dst}, v, v)
	VMOVUPS(v, Mem{Base: dst})
	ADDQ(U8(vb), src)
	ADDQ(U8(vb), dst)
	SUBQ(U8(isa.lanes), n)
	JMP(LabelRef("one"))
	Label("done")
	VZEROUPPER()
	RET()
}

// sumRowsVec emits sumRows<ISA>: dst[j] += src[i*ld+j] for each of rows
// rows in order, for j < cols, a multiple of the lanes. It runs down the
// rows for a block of eight vectors of columns at a time (eight
// independent sums), then for one vector at a time.
func sumRowsVec(isa vecISA) {
	name := "sumRows" + isa.suffix
	TEXT(name, NOSPLIT, "func(dst, src *float32, rows, cols, ld int)")
	Doc(
		fmt.Sprintf("%s adds to dst[j] the elements src[i*ld+j] of rows rows (rows >= 1), in row", name),
		fmt.Sprintf("order, for j < cols, a multiple of %d.", isa.lanes),
	)
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	rows := Load(Param("rows"), GP64())
	cols := Load(Param("cols"), GP64())
	ld := Load(Param("ld"), GP64())
	SHLQ(U8(2), ld)
	vb := 4 * isa.lanes
	for _, width := range []int{8, 1} {
		block := fmt.Sprintf("block%d", width)
		Label(block)
		CMPQ(cols, U32(width*isa.lanes))
		JL(LabelRef(fmt.Sprintf("after%d", width)))
		acc := make([]VecVirtual, width)
		for k := range acc {
			acc[k] = isa.vec()
			VMOVUPS(Mem{Base: dst, Disp: k * vb}, acc[k])
		}
		p, r := GP64(), GP64()
		MOVQ(src, p)
		MOVQ(rows, r)
		down := fmt.Sprintf("down%d", width)
		Label(down)
		for k := range acc {
			VADDPS(Mem{Base: p, Disp: k * vb}, acc[k], acc[k])
		}
		ADDQ(ld, p)
		DECQ(r)
		JNE(LabelRef(down))
		for k := range acc {
			VMOVUPS(acc[k], Mem{Base: dst, Disp: k * vb})
		}
		ADDQ(U32(width*vb), dst)
		ADDQ(U32(width*vb), src)
		SUBQ(U32(width*isa.lanes), cols)
		JMP(LabelRef(block))
		Label(fmt.Sprintf("after%d", width))
	}
	VZEROUPPER()
	RET()
}
