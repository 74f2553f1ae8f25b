package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// softmaxKernels emits the rows of causal attention's softmax and its
// backward for every vector width (softmax_amd64.s): softmax<ISA> and
// softmaxBackward<ISA>.
func softmaxKernels() {
	c := mathConsts("softmaxconsts")
	for _, isa := range vecISAs {
		softmaxRow(isa, c)
		softmaxBackwardRow(isa)
	}
	masks := softmaxMasks()
	softmaxShort(vecISAs[1], c, masks)
	softmaxBackwardWhole(vecISAs[1], masks)
}

// softmaxRow emits softmax<ISA>: x = softmax(scale·x) over x[0..n), n a
// positive multiple of the lanes, in one call with the instructions of
// maxSum, expSum and scale one after the other, so its bits are those of
// the three kernels called in turn: m = max(x)·scale, x[i] = exp(x[i]·scale
// - m) summed into sum, x[i] *= 1/sum.
func softmaxRow(isa vecISA, c func(string) Mem) {
	name := "softmax" + isa.suffix
	TEXT(name, NOSPLIT, "func(x *float32, n int, scale float32)")
	Doc(
		fmt.Sprintf("%s replaces x[i] for i < n, a positive multiple of %d, by", name, isa.lanes),
		"exp(x[i]·scale - m)/sum with m the largest x[i] times scale and sum the sum",
		fmt.Sprintf("of the exponentials: the bits of max%s, expSum%s and scale%s in turn.", isa.suffix, isa.suffix, isa.suffix),
	)
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	scaleX := Load(Param("scale"), XMM())
	vb := 4 * isa.lanes

	// The largest element, one vector at a time in index order as maxSum.
	p, left := GP64(), GP64()
	MOVQ(x, p)
	MOVQ(n, left)
	mx := isa.vec()
	VMOVUPS(Mem{Base: p}, mx)
	ADDQ(U32(vb), p)
	SUBQ(U32(isa.lanes), left)
	Label("max")
	TESTQ(left, left)
	JE(LabelRef("maxDone"))
	VMAXPS(Mem{Base: p}, mx, mx)
	ADDQ(U32(vb), p)
	SUBQ(U32(isa.lanes), left)
	JMP(LabelRef("max"))
	Label("maxDone")
	shiftX := XMM()
	VMULSS(scaleX, horizontalMax(isa, mx), shiftX)

	// The exponentials and their sum, as expSum.
	scale, shift := isa.vec(), isa.vec()
	VBROADCASTSS(scaleX, scale)
	VBROADCASTSS(shiftX, shift)
	acc := isa.vec()
	zero(isa, acc)
	lo, hi := clampRegs(isa, c)
	MOVQ(x, p)
	MOVQ(n, left)
	vecLoop(isa, left, []Register{p}, func(vecs int) {
		xs := make([]VecVirtual, vecs)
		for i := range xs {
			xs[i] = isa.vec()
			VMOVUPS(Mem{Base: p, Disp: vb * i}, xs[i])
			VFMSUB213PS(shift, scale, xs[i])
		}
		expInPlace(isa, c, xs, lo, hi)
		for i, v := range xs {
			VMOVUPS(v, Mem{Base: p, Disp: vb * i})
			VADDPS(v, acc, acc)
		}
	})

	// x[i] *= 1/sum, four vectors a round while there are four.
	inv := XMM()
	VMOVSS(c("one"), inv)
	VDIVSS(horizontalSum(isa, acc), inv, inv)
	s := isa.vec()
	VBROADCASTSS(inv, s)
	const unroll = 4
	Label("wide")
	CMPQ(n, U32(unroll*isa.lanes))
	JL(LabelRef("one"))
	for k := range unroll {
		v := isa.vec()
		VMULPS(Mem{Base: x, Disp: k * vb}, s, v)
		VMOVUPS(v, Mem{Base: x, Disp: k * vb})
	}
	ADDQ(U32(unroll*vb), x)
	SUBQ(U32(unroll*isa.lanes), n)
	JMP(LabelRef("wide"))
	Label("one")
	TESTQ(n, n)
	JE(LabelRef("done"))
	v := isa.vec()
	VMULPS(Mem{Base: x}, s, v)
	VMOVUPS(v, Mem{Base: x})
	ADDQ(U32(vb), x)
	SUBQ(U32(isa.lanes), n)
	JMP(LabelRef("one"))
	Label("done")
	VZEROUPPER()
	RET()
}

// softmaxBackwardRow emits softmaxBackward<ISA>: with s = sum of p[k]·d[k]
// for k < live, in eight interleaved partial sums (lane l of a ymm takes
// the k = l mod 8 of the whole groups of eight, the rest goes to lane 0
// in order) added as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), it sets d[j] =
// (scale·p[j])·(d[j] - s) for j < n (a multiple of the lanes) and
// returns s. Products and sums are rounded one by one (no fused
// multiply-add), as the portable Go code does.
func softmaxBackwardRow(isa vecISA) {
	name := "softmaxBackward" + isa.suffix
	TEXT(name, NOSPLIT, "func(d, p *float32, live, n int, scale float32) float32")
	Doc(
		fmt.Sprintf("%s sets d[j] = (scale·p[j])·(d[j] - s) for j < n, a multiple of %d,", name, isa.lanes),
		"with s the sum of p[k]·d[k] for k < live in eight interleaved partial sums",
		"(see goSoftmaxBackward), and returns s: goSoftmaxBackward's bits.",
	)
	d := Load(Param("d"), GP64())
	p := Load(Param("p"), GP64())
	live := Load(Param("live"), GP64())
	n := Load(Param("n"), GP64())
	scaleX := Load(Param("scale"), XMM())

	sum := softmaxDot(d, p, live)
	Store(sum, ReturnIndex(0))

	sv, scale := isa.vec(), isa.vec()
	VBROADCASTSS(sum, sv)
	VBROADCASTSS(scaleX, scale)
	vb := 4 * isa.lanes
	Label("update")
	TESTQ(n, n)
	JE(LabelRef("done"))
	sp, u := isa.vec(), isa.vec()
	VMULPS(Mem{Base: p}, scale, sp)
	VMOVUPS(Mem{Base: d}, u)
	VSUBPS(sv, u, u)
	VMULPS(u, sp, u)
	VMOVUPS(u, Mem{Base: d})
	ADDQ(U32(vb), p)
	ADDQ(U32(vb), d)
	SUBQ(U32(isa.lanes), n)
	JMP(LabelRef("update"))
	Label("done")
	VZEROUPPER()
	RET()
}

// softmaxMasks emits the table softmaxShort and softmaxBackwardWhole read: 16 times -Inf,
// then at byte 64 + 2t the 16-bit mask of the first t lanes, for t in 0..16.
func softmaxMasks() Mem {
	table := GLOBL("softmaxmasks", RODATA|NOPTR)
	for l := 0; l < 16; l++ {
		DATA(4*l, U32(0xff800000)) // -Inf
	}
	for t := 0; t <= 16; t++ {
		DATA(64+2*t, U16(1<<t-1)) // the first t lanes
	}
	return table
}

// softmaxBackwardWhole emits softmaxBackwardWhole<ISA> (AVX-512 only, for its masks): a
// whole row of CausalSoftmaxBackward, d[:end] from p[:live] (end a multiple of the lanes,
// live <= end): softmaxBackward<ISA>'s bits for d[:live], then 0 up to end.
func softmaxBackwardWhole(isa vecISA, table Mem) {
	name := "softmaxBackwardWhole" + isa.suffix
	TEXT(name, NOSPLIT, "func(d, p *float32, live, end int, scale float32)")
	Doc(
		fmt.Sprintf("%s sets d[j] = (scale·p[j])·(d[j] - s) for j < live as softmaxBackward%s,", name, isa.suffix),
		fmt.Sprintf("and d[j] = 0 for live <= j < end, a multiple of %d no less than live >= 1.", isa.lanes),
	)
	d := Load(Param("d"), GP64())
	p := Load(Param("p"), GP64())
	live := Load(Param("live"), GP64())
	end := Load(Param("end"), GP64())
	scaleX := Load(Param("scale"), XMM())
	sum := softmaxDot(d, p, live)
	// live's lanes of the last vector it reaches, and the vectors before that.
	last, tab, m := GP64(), GP64(), GP32()
	LEAQ(table, tab)
	MOVQ(live, last)
	DECQ(last)
	ANDQ(U8(isa.lanes-1), last)
	INCQ(last)
	MOVWLZX(Mem{Base: tab, Index: last, Scale: 2, Disp: 64}, m)
	KMOVW(m, K1)
	SUBQ(last, live)
	SUBQ(live, end)

	sv, scale := isa.vec(), isa.vec()
	VBROADCASTSS(sum, sv)
	VBROADCASTSS(scaleX, scale)
	vb := 4 * isa.lanes
	update := func(masked bool) {
		sp, u := isa.vec(), isa.vec()
		VMULPS(Mem{Base: p}, scale, sp)
		VMOVUPS(Mem{Base: d}, u)
		VSUBPS(sv, u, u)
		if masked {
			VMULPS_Z(u, sp, K1, u)
		} else {
			VMULPS(u, sp, u)
		}
		VMOVUPS(u, Mem{Base: d})
		ADDQ(U32(vb), p)
		ADDQ(U32(vb), d)
	}
	Label("update")
	TESTQ(live, live)
	JE(LabelRef("last"))
	update(false)
	SUBQ(U32(isa.lanes), live)
	JMP(LabelRef("update"))
	Label("last")
	update(true)
	SUBQ(U32(isa.lanes), end)
	z := isa.vec()
	zero(isa, z)
	Label("zero")
	TESTQ(end, end)
	JE(LabelRef("done"))
	VMOVUPS(z, Mem{Base: d})
	ADDQ(U32(vb), d)
	SUBQ(U32(isa.lanes), end)
	JMP(LabelRef("zero"))
	Label("done")
	VZEROUPPER()
	RET()
}

// softmaxMaxVectors is the longest row, in vectors, that softmaxShort holds in
// registers: a causal attention's row for a context of 128 in zmm.
const softmaxMaxVectors = 8

// softmaxShort emits softmaxShort<ISA> (AVX-512 only, for its masks): the row softmax of
// softmax<ISA> on rows of 1 to softmaxMaxVectors vectors, each loaded once into registers
// with the lanes from live on read as -Inf (not from memory), its maximum as a tree, the
// exponentials of all its vectors side by side (in groups of four, for the registers)
// summed in index order, scaled, and stored with the lanes from live on as 0. The live
// lanes, and the sum, are the bits of softmax<ISA> on the row padded with -Inf.
func softmaxShort(isa vecISA, c func(string) Mem, table Mem) {
	name := "softmaxShort" + isa.suffix
	TEXT(name, NOSPLIT, "func(x *float32, live, n int, scale float32)")
	Doc(
		fmt.Sprintf("%s does softmax%s on x[:n], n = %d·v for v in 1..%d, with", name, isa.suffix, isa.lanes, softmaxMaxVectors),
		"x[live:n] taken as -Inf and set to 0, for n-16 < live <= n: the bits of the padded row's.",
	)
	x := Load(Param("x"), GP64())
	live := Load(Param("live"), GP64())
	n := Load(Param("n"), GP64())
	scaleX := Load(Param("scale"), XMM())
	tab := GP64()
	LEAQ(table, tab)
	SUBQ(n, live)
	ADDQ(U8(16), live) // live lanes of the last vector
	m := GP32()
	MOVWLZX(Mem{Base: tab, Index: live, Scale: 2, Disp: 64}, m)
	KMOVW(m, K1)
	for nv := 1; nv <= softmaxMaxVectors; nv++ {
		CMPQ(n, U32(nv*isa.lanes))
		JE(LabelRef(fmt.Sprintf("regs%d", nv)))
	}
	RET() // not reached: the caller passes a whole number of vectors up to the maximum
	vb := 4 * isa.lanes
	for nv := 1; nv <= softmaxMaxVectors; nv++ {
		Label(fmt.Sprintf("regs%d", nv))
		xs := make([]VecVirtual, nv)
		for i := range xs {
			xs[i] = isa.vec()
			if i < nv-1 {
				VMOVUPS(Mem{Base: x, Disp: vb * i}, xs[i])
			} else {
				VMOVUPS(Mem{Base: tab}, xs[i])
				VMOVUPS(Mem{Base: x, Disp: vb * i}, K1, xs[i])
			}
		}
		mxs := append([]VecVirtual(nil), xs...)
		for len(mxs) > 1 {
			var next []VecVirtual
			for i := 0; i+1 < len(mxs); i += 2 {
				m := isa.vec()
				VMAXPS(mxs[i+1], mxs[i], m)
				next = append(next, m)
			}
			if len(mxs)%2 == 1 {
				next = append(next, mxs[len(mxs)-1])
			}
			mxs = next
		}
		shiftX := XMM()
		VMULSS(scaleX, horizontalMax(isa, mxs[0]), shiftX)
		scale, shift := isa.vec(), isa.vec()
		VBROADCASTSS(scaleX, scale)
		VBROADCASTSS(shiftX, shift)
		lo, hi := clampRegs(isa, c)
		for i := range xs {
			VFMSUB213PS(shift, scale, xs[i])
		}
		for g := 0; g < nv; g += 4 {
			expInPlace(isa, c, xs[g:min(g+4, nv)], lo, hi)
		}
		acc := isa.vec()
		VMOVAPS(xs[0], acc) // 0 + x0, exactly
		for _, v := range xs[1:] {
			VADDPS(v, acc, acc)
		}
		inv := XMM()
		VMOVSS(c("one"), inv)
		VDIVSS(horizontalSum(isa, acc), inv, inv)
		s := isa.vec()
		VBROADCASTSS(inv, s)
		for i, v := range xs {
			if i < nv-1 {
				VMULPS(v, s, v)
			} else {
				VMULPS_Z(v, s, K1, v)
			}
			VMOVUPS(v, Mem{Base: x, Disp: vb * i})
		}
		VZEROUPPER()
		RET()
	}
}

// softmaxDot emits the sum of p[k]·d[k] for k < n of softmaxBackward<ISA> (see there;
// on ymm for every ISA, for its eight partial sums) and returns the xmm register whose
// lowest lane holds it. It leaves d, p and n as they were.
func softmaxDot(d, p, n Register) VecVirtual {
	dp, pp, live := GP64(), GP64(), GP64()
	MOVQ(d, dp)
	MOVQ(p, pp)
	MOVQ(n, live)
	acc := YMM()
	VXORPS(acc, acc, acc)
	Label("dot")
	CMPQ(live, U8(8))
	JL(LabelRef("dotTail"))
	t := YMM()
	VMOVUPS(Mem{Base: pp}, t)
	VMULPS(Mem{Base: dp}, t, t)
	VADDPS(t, acc, acc)
	ADDQ(U8(32), pp)
	ADDQ(U8(32), dp)
	SUBQ(U8(8), live)
	JMP(LabelRef("dot"))
	Label("dotTail")
	hi, lo := XMM(), acc.AsX()
	VEXTRACTF128(U8(1), acc, hi)
	Label("tail")
	TESTQ(live, live)
	JE(LabelRef("sum"))
	ts := XMM()
	VMOVSS(Mem{Base: pp}, ts)
	VMULSS(Mem{Base: dp}, ts, ts)
	VADDSS(ts, lo, lo) // lane 0 only: s0 += p·d
	ADDQ(U8(4), pp)
	ADDQ(U8(4), dp)
	DECQ(live)
	JMP(LabelRef("tail"))
	Label("sum")
	pairs, quads, sum := XMM(), XMM(), XMM()
	VHADDPS(hi, lo, pairs)       // s0+s1, s2+s3, s4+s5, s6+s7
	VHADDPS(pairs, pairs, quads) // (s0+s1)+(s2+s3), (s4+s5)+(s6+s7)
	VHADDPS(quads, quads, sum)   // their sum
	return sum
}
