package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// vecISA is one vector width the elementwise kernels are emitted for: the
// same instructions on ymm (AVX2/FMA, 8 floats) or zmm (AVX-512F, 16).
type vecISA struct {
	suffix string            // of the function names: AVX2 or AVX512
	lanes  int               // floats per register
	vec    func() VecVirtual // a fresh register of the width
}

var vecISAs = []vecISA{
	{suffix: "AVX2", lanes: 8, vec: YMM},
	{suffix: "AVX512", lanes: 16, vec: ZMM},
}

// expConsts are the constants of the vector exp, in the order of the
// table mathConsts lays out: each is repeated 16 times (one zmm, or two
// ymm), so an instruction can take it as a whole-register memory operand.
var expConsts = []struct {
	name string
	bits uint32
}{
	{"lo", math.Float32bits(-87)},
	{"hi", math.Float32bits(88)},
	{"log2e", math.Float32bits(1.44269504088896341)},
	{"round", math.Float32bits(12582912)}, // 1.5·2^23: adding and subtracting it rounds to an integer
	{"ln2hi", math.Float32bits(0.693145751953125)},
	{"ln2lo", math.Float32bits(1.42860682030941723212e-6)},
	{"c7", math.Float32bits(1.0 / 5040)},
	{"c6", math.Float32bits(1.0 / 720)},
	{"c5", math.Float32bits(1.0 / 120)},
	{"c4", math.Float32bits(1.0 / 24)},
	{"c3", math.Float32bits(1.0 / 6)},
	{"c2", math.Float32bits(1.0 / 2)},
	{"one", math.Float32bits(1)},
	{"bias", 127}, // the exponent bias, an int32
	{"two", math.Float32bits(2)},
	{"half", math.Float32bits(0.5)},
	{"gelu3", math.Float32bits(0.044715)},
	{"gelu2c", math.Float32bits(2 * 0.7978845608028654)}, // 2·sqrt(2/pi): exp's argument for tanh
	{"gelu3x3", math.Float32bits(3 * 0.044715)},
	{"halfc", math.Float32bits(0.5 * 0.7978845608028654)},
}

// mathConsts emits the table of expConsts, named symbol (one per
// assembly file), and returns a lookup of each constant's memory operand.
func mathConsts(symbol string) func(name string) Mem {
	table := GLOBL(symbol, RODATA|NOPTR)
	at := map[string]int{}
	for i, c := range expConsts {
		at[c.name] = 64 * i
		for l := 0; l < 16; l++ {
			DATA(64*i+4*l, U32(c.bits))
		}
	}
	return func(name string) Mem {
		off, ok := at[name]
		if !ok {
			panic(fmt.Sprintf("no constant %q", name))
		}
		return table.Offset(off)
	}
}

// expInPlace emits x = exp(x) lane by lane, with x clamped to [-87, 88]
// first, by the algorithm of the kernels' expf: k = round(x·log2 e),
// r = x - k·ln 2 (in two parts), exp(r) by its degree-7 Taylor
// polynomial, times 2^k built in the exponent bits.
//
// lo and hi hold -87 and 88 in every lane (see clampRegs): the clamp
// keeps a NaN (VMAXPS and VMINPS return their last operand when either is
// NaN), so exp(NaN) is NaN, as in the portable expf.
//
// It does so for each register of xs, each step for all of them before
// the next: the steps form a chain of dependent instructions as long as
// the polynomial, and independent vectors side by side let the core
// overlap their latencies. The result of each lane does not depend on
// how many there are.
func expInPlace(isa vecISA, c func(string) Mem, xs []VecVirtual, lo, hi VecVirtual) {
	each := func(f func(i int, x VecVirtual)) {
		for i, x := range xs {
			f(i, x)
		}
	}
	k, r, p := make([]VecVirtual, len(xs)), make([]VecVirtual, len(xs)), make([]VecVirtual, len(xs))
	each(func(i int, x VecVirtual) { k[i], r[i], p[i] = isa.vec(), isa.vec(), isa.vec() })
	each(func(i int, x VecVirtual) { VMAXPS(x, lo, x) })
	each(func(i int, x VecVirtual) { VMINPS(x, hi, x) })
	each(func(i int, x VecVirtual) { VMULPS(c("log2e"), x, k[i]) })
	if isa.lanes == 16 {
		// One instruction rounds to the nearest integer, ties to even,
		// as adding and subtracting 1.5·2^23 does.
		each(func(i int, x VecVirtual) { VRNDSCALEPS(U8(0), k[i], k[i]) })
	} else {
		each(func(i int, x VecVirtual) { VADDPS(c("round"), k[i], k[i]) })
		each(func(i int, x VecVirtual) { VSUBPS(c("round"), k[i], k[i]) })
	}
	each(func(i int, x VecVirtual) { VMOVAPS(x, r[i]) })
	each(func(i int, x VecVirtual) { VFNMADD231PS(c("ln2hi"), k[i], r[i]) })
	each(func(i int, x VecVirtual) { VFNMADD231PS(c("ln2lo"), k[i], r[i]) })
	each(func(i int, x VecVirtual) { VMOVUPS(c("c7"), p[i]) })
	for _, name := range []string{"c6", "c5", "c4", "c3", "c2", "one", "one"} {
		each(func(i int, x VecVirtual) { VFMADD213PS(c(name), r[i], p[i]) })
	}
	if isa.lanes == 16 {
		// p·2^k in one instruction, the same exact product by a power of
		// two as building 2^k in the exponent bits (k >= -126 after the
		// clamp, so 2^k is a normal float).
		each(func(i int, x VecVirtual) { VSCALEFPS(k[i], p[i], x) })
		return
	}
	each(func(i int, x VecVirtual) { VCVTPS2DQ(k[i], k[i]) })
	each(func(i int, x VecVirtual) { VPADDD(c("bias"), k[i], k[i]) })
	each(func(i int, x VecVirtual) { VPSLLD(U8(23), k[i], k[i]) })
	each(func(i int, x VecVirtual) { VMULPS(k[i], p[i], x) })
}

// unrollExp is how many vectors the kernels built on expInPlace compute
// side by side: as many as the ISA's registers hold (16 ymm, 32 zmm).
func (isa vecISA) unrollExp() int {
	if isa.lanes == 16 {
		return 4
	}
	return 2
}

// vecLoop emits a loop over n floats (n a multiple of the lanes) that
// calls body with the count of vectors to do this round, isa.unrollExp()
// while that many remain and then one, and advances ptrs by that many
// vectors after each round.
func vecLoop(isa vecISA, n Register, ptrs []Register, body func(vecs int)) {
	for _, vecs := range []int{isa.unrollExp(), 1} {
		loop := fmt.Sprintf("loop%d", vecs)
		Label(loop)
		CMPQ(n, U32(vecs*isa.lanes))
		JL(LabelRef(fmt.Sprintf("after%d", vecs)))
		body(vecs)
		for _, p := range ptrs {
			ADDQ(U32(4*isa.lanes*vecs), p)
		}
		SUBQ(U32(vecs*isa.lanes), n)
		JMP(LabelRef(loop))
		Label(fmt.Sprintf("after%d", vecs))
	}
}

// clampRegs loads the bounds of expInPlace's clamp into two registers.
func clampRegs(isa vecISA, c func(string) Mem) (lo, hi VecVirtual) {
	lo, hi = isa.vec(), isa.vec()
	VMOVUPS(c("lo"), lo)
	VMOVUPS(c("hi"), hi)
	return lo, hi
}

// zero emits v = 0 with an instruction of the ISA (VXORPS on zmm needs
// AVX512DQ, VPXORD only AVX512F).
func zero(isa vecISA, v VecVirtual) {
	if isa.lanes == 16 {
		VPXORD(v, v, v)
	} else {
		VXORPS(v, v, v)
	}
}

// expSum emits expSum<ISA>: dst[i] = exp(src[i]·scale - shift) for i < n
// (n a multiple of the lanes) and the sum of them, in lanes then across.
func expSum(isa vecISA, c func(string) Mem) {
	name := "expSum" + isa.suffix
	TEXT(name, NOSPLIT, "func(dst, src *float32, n int, scale, shift float32) float32")
	Doc(
		fmt.Sprintf("%s writes dst[i] = exp(src[i]·scale - shift) for i < n, a multiple of %d,", name, isa.lanes),
		"with the argument clamped to [-87, 88], and returns the sum of them. dst may be src.",
	)
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	scale, shift := isa.vec(), isa.vec()
	VBROADCASTSS(Load(Param("scale"), XMM()), scale)
	VBROADCASTSS(Load(Param("shift"), XMM()), shift)
	acc := isa.vec()
	zero(isa, acc)
	lo, hi := clampRegs(isa, c)
	vecLoop(isa, n, []Register{src, dst}, func(vecs int) {
		xs := make([]VecVirtual, vecs)
		for i := range xs {
			xs[i] = isa.vec()
			VMOVUPS(Mem{Base: src, Disp: 4 * isa.lanes * i}, xs[i])
			VFMSUB213PS(shift, scale, xs[i])
		}
		expInPlace(isa, c, xs, lo, hi)
		for i, x := range xs { // the sum in index order, as one vector at a time
			VMOVUPS(x, Mem{Base: dst, Disp: 4 * isa.lanes * i})
			VADDPS(x, acc, acc)
		}
	})
	Store(horizontalSum(isa, acc), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// horizontalSum emits the sum of the lanes of v and returns the xmm
// register whose lowest lane holds it.
func horizontalSum(isa vecISA, v VecVirtual) VecVirtual {
	y := v
	if isa.lanes == 16 {
		hi := YMM()
		VEXTRACTF64X4(U8(1), v, hi)
		y = YMM()
		VADDPS(hi, v.(Register).(VecVirtual).AsY(), y)
	}
	hi, lo := XMM(), XMM()
	VEXTRACTF128(U8(1), y, hi)
	VADDPS(hi, y.AsX(), lo)
	VHADDPS(lo, lo, lo)
	VHADDPS(lo, lo, lo)
	return lo
}

// gelu emits gelu<ISA>: for i < n (a multiple of the lanes), with v =
// h[i] and t = tanh(sqrt(2/pi)·(v + 0.044715 v³)) as 1 - 2/(exp(2u)+1),
// out[i] = 0.5 v (1 + t) and dgelu[i] = gelu'(v) = 0.5 (1 + t) + 0.5 v
// (1 - t²) sqrt(2/pi) (1 + 3·0.044715 v²).
func gelu(isa vecISA, c func(string) Mem) {
	name := "gelu" + isa.suffix
	TEXT(name, NOSPLIT, "func(out, dgelu, h *float32, n int)")
	Doc(
		fmt.Sprintf("%s writes out[i] = 0.5·h[i]·(1 + t) with t = tanh(sqrt(2/pi)·(h[i] + 0.044715·h[i]³)),", name),
		"GPT-2's tanh GELU, and its derivative dgelu[i] = 0.5 (1 + t) + 0.5 h[i] (1 - t²) sqrt(2/pi)",
		fmt.Sprintf("(1 + 3·0.044715 h[i]²), for i < n, a multiple of %d.", isa.lanes),
	)
	out := Load(Param("out"), GP64())
	dg := Load(Param("dgelu"), GP64())
	h := Load(Param("h"), GP64())
	n := Load(Param("n"), GP64())
	one, two, half := isa.vec(), isa.vec(), isa.vec()
	VMOVUPS(c("one"), one)
	VMOVUPS(c("two"), two)
	VMOVUPS(c("half"), half)
	lo, hi := clampRegs(isa, c)
	vecLoop(isa, n, []Register{h, dg, out}, func(vecs int) {
		vs, us := make([]VecVirtual, vecs), make([]VecVirtual, vecs)
		for i := range us {
			v, u := isa.vec(), isa.vec()
			vs[i], us[i] = v, u
			VMOVUPS(Mem{Base: h, Disp: 4 * isa.lanes * i}, v)
			VMULPS(v, v, u)
			VMULPS(c("gelu3"), u, u)
			VFMADD213PS(v, v, u) // u = v·(0.044715 v²) + v
			VMULPS(c("gelu2c"), u, u)
		}
		expInPlace(isa, c, us, lo, hi)
		for i, u := range us {
			off := 4 * isa.lanes * i
			VADDPS(one, u, u)
			t := isa.vec()
			VDIVPS(u, two, t)
			VSUBPS(t, one, t)
			geluDerivative(isa, c, vs[i], t, one, half, Mem{Base: dg, Disp: off})
			hv := isa.vec()
			VMULPS(half, vs[i], hv)
			VFMADD213PS(hv, hv, t) // t = hv·t + hv
			VMOVUPS(t, Mem{Base: out, Disp: off})
		}
	})
	VZEROUPPER()
	RET()
}

// geluDerivative emits the store at dst of GELU's derivative at x given
// t = tanh(sqrt(2/pi)·(x + 0.044715 x³)): 0.5 (1 + t) + 0.5 x (1 - t²)
// sqrt(2/pi) (1 + 3·0.044715 x²).
func geluDerivative(isa vecISA, c func(string) Mem, x, t, one, half VecVirtual, dst Mem) {
	a := isa.vec()
	VADDPS(one, t, a)
	VMULPS(half, a, a) // a = 0.5 (1 + t)
	b := isa.vec()
	VMOVAPS(one, b)
	VFNMADD231PS(t, t, b) // b = 1 - t²
	x2 := isa.vec()
	VMULPS(x, x, x2)
	VMULPS(c("gelu3x3"), x2, x2)
	VADDPS(one, x2, x2) // 1 + 3·0.044715 x²
	d := isa.vec()
	VMULPS(c("halfc"), x, d)
	VMULPS(b, d, d)
	VFMADD213PS(a, x2, d) // d = d·x2 + a
	VMOVUPS(d, dst)
}

// rowPair is how many rows the layer norm kernels compute side by side:
// a row's sums are chains of dependent additions, and two independent
// rows let the core overlap their latencies. Each row's arithmetic is the
// same as alone.
const rowPair = 2

// rowLoop emits a loop over rows rows that calls body with the number of
// rows to do this round, rowPair while that many remain and then one, and
// then advances each of perRow by that many rows of rowBytes bytes and
// each of perFloat by that many floats.
func rowLoop(rows, rowBytes Register, perRow, perFloat []Register, body func(r int)) {
	for _, r := range []int{rowPair, 1} {
		loop := fmt.Sprintf("rows%d", r)
		Label(loop)
		CMPQ(rows, U8(r))
		JL(LabelRef(fmt.Sprintf("rowsAfter%d", r)))
		body(r)
		for _, p := range perRow {
			for range r {
				ADDQ(rowBytes, p)
			}
		}
		for _, p := range perFloat {
			ADDQ(U8(4*r), p)
		}
		SUBQ(U8(r), rows)
		JMP(LabelRef(loop))
		Label(fmt.Sprintf("rowsAfter%d", r))
	}
}

// colLoop emits a loop over the d floats of a row (d a positive multiple
// of the lanes) that advances ptrs by a vector after each call of body.
func colLoop(isa vecISA, d Register, ptrs []Register, body func()) {
	j := GP64()
	MOVQ(d, j)
	loop := fmt.Sprintf("cols%d", labelCount())
	Label(loop)
	body()
	for _, p := range ptrs {
		ADDQ(U8(4*isa.lanes), p)
	}
	SUBQ(U8(isa.lanes), j)
	JNE(LabelRef(loop))
}

// rowMem is the vector at p in row r of rows rowBytes apart (r < 2).
func rowMem(p, rowBytes Register, r int) Mem {
	if r == 0 {
		return Mem{Base: p}
	}
	return Mem{Base: p, Index: rowBytes, Scale: 1}
}

// copyRegs emits fresh copies of the registers: pointers a column loop
// may advance while the originals stay at the start of the rows.
func copyRegs(regs ...Register) []Register {
	out := make([]Register, len(regs))
	for i, r := range regs {
		c := GP64()
		MOVQ(r, c)
		out[i] = c
	}
	return out
}

var labels int

func labelCount() int { labels++; return labels }

// layerNorm emits layerNorm<ISA>: for each of rows rows of d floats (d a
// positive multiple of the lanes) at x, mean = Σx/d, rstd = 1/sqrt(Σ(x -
// mean)²/d + eps), out = (x - mean)·rstd·w + b; mean and rstd are kept.
// Rows go rowPair at a time (see rowPair).
func layerNorm(isa vecISA) {
	name := "layerNorm" + isa.suffix
	TEXT(name, NOSPLIT, "func(out, mean, rstd, x, w, b *float32, rows, d int, invD, eps float32)")
	Doc(
		fmt.Sprintf("%s normalizes rows rows of d floats (d a positive multiple of %d) at x", name, isa.lanes),
		"into out: out = (x - mean)·rstd·w + b with mean = Σx·invD and rstd =",
		"1/sqrt(Σ(x - mean)²·invD + eps), stored in mean[i] and rstd[i].",
	)
	out := Load(Param("out"), GP64())
	mean := Load(Param("mean"), GP64())
	rstd := Load(Param("rstd"), GP64())
	x := Load(Param("x"), GP64())
	rows := Load(Param("rows"), GP64())
	d := Load(Param("d"), GP64())
	invD, eps := Load(Param("invD"), XMM()), Load(Param("eps"), XMM())
	rowBytes := GP64()
	MOVQ(d, rowBytes)
	SHLQ(U8(2), rowBytes)

	rowLoop(rows, rowBytes, []Register{x, out}, []Register{mean, rstd}, func(nr int) {
		acc, MU, sq, R := make([]VecVirtual, nr), make([]VecVirtual, nr), make([]VecVirtual, nr), make([]VecVirtual, nr)
		for r := range nr {
			acc[r] = isa.vec()
			zero(isa, acc[r])
		}
		xp := copyRegs(x)[0]
		colLoop(isa, d, []Register{xp}, func() {
			for r := range nr {
				VADDPS(rowMem(xp, rowBytes, r), acc[r], acc[r])
			}
		})
		for r := range nr {
			mu := horizontalSum(isa, acc[r])
			VMULSS(invD, mu, mu)
			VMOVSS(mu, Mem{Base: mean, Disp: 4 * r})
			MU[r] = isa.vec()
			VBROADCASTSS(mu, MU[r])
			sq[r] = isa.vec()
			zero(isa, sq[r])
		}
		xp = copyRegs(x)[0]
		colLoop(isa, d, []Register{xp}, func() {
			for r := range nr {
				v := isa.vec()
				VMOVUPS(rowMem(xp, rowBytes, r), v)
				VSUBPS(MU[r], v, v)
				VFMADD231PS(v, v, sq[r])
			}
		})
		for r := range nr {
			vr := horizontalSum(isa, sq[r])
			VMULSS(invD, vr, vr)
			VADDSS(eps, vr, vr)
			VSQRTSS(vr, vr, vr)
			rs := XMM()
			VMOVSS(c1(), rs)
			VDIVSS(vr, rs, rs)
			VMOVSS(rs, Mem{Base: rstd, Disp: 4 * r})
			R[r] = isa.vec()
			VBROADCASTSS(rs, R[r])
		}
		wp, bp := GP64(), GP64()
		Load(Param("w"), wp)
		Load(Param("b"), bp)
		ptrs := copyRegs(x, out)
		xp, op := ptrs[0], ptrs[1]
		colLoop(isa, d, []Register{xp, op, wp, bp}, func() {
			wv := isa.vec()
			VMOVUPS(Mem{Base: wp}, wv)
			for r := range nr {
				v := isa.vec()
				VMOVUPS(rowMem(xp, rowBytes, r), v)
				VSUBPS(MU[r], v, v)
				VMULPS(R[r], v, v)
				VFMADD213PS(Mem{Base: bp}, wv, v) // v = w·v + b
				VMOVUPS(v, rowMem(op, rowBytes, r))
			}
		})
	})
	VZEROUPPER()
	RET()
}

// oneConst is the memory operand of the constant 1 in the table, set by
// vecMath before the kernels that need it are emitted.
var oneConst Mem

func c1() Mem { return oneConst }

// layerNormBack emits layerNormBackward<ISA>: for each of rows rows of d
// floats (d a positive multiple of the lanes), with xhat = (x - mean)·rstd
// and gw = dout·w: dw += dout·xhat, db += dout, and dx += rstd·(gw -
// Σgw·invD - xhat·Σ(gw·xhat)·invD). Rows go rowPair at a time (see
// rowPair), adding to dw and db in row order.
func layerNormBack(isa vecISA) {
	name := "layerNormBackward" + isa.suffix
	TEXT(name, NOSPLIT, "func(dx, dw, db, dout, x, mean, rstd, w *float32, rows, d int, invD float32)")
	Doc(
		fmt.Sprintf("%s adds to dx, dw and db the gradient of the layer norm of rows rows", name),
		fmt.Sprintf("of d floats (d a positive multiple of %d) at x, given dout and the mean and", isa.lanes),
		"rstd of each row from the forward pass.",
	)
	dx := Load(Param("dx"), GP64())
	dout := Load(Param("dout"), GP64())
	x := Load(Param("x"), GP64())
	mean := Load(Param("mean"), GP64())
	rstd := Load(Param("rstd"), GP64())
	rows := Load(Param("rows"), GP64())
	d := Load(Param("d"), GP64())
	invD := Load(Param("invD"), XMM())
	rowBytes := GP64()
	MOVQ(d, rowBytes)
	SHLQ(U8(2), rowBytes)

	rowLoop(rows, rowBytes, []Register{x, dout, dx}, []Register{mean, rstd}, func(nr int) {
		MU, R, sg, sgx := make([]VecVirtual, nr), make([]VecVirtual, nr), make([]VecVirtual, nr), make([]VecVirtual, nr)
		for r := range nr {
			MU[r], R[r], sg[r], sgx[r] = isa.vec(), isa.vec(), isa.vec(), isa.vec()
			VBROADCASTSS(Mem{Base: mean, Disp: 4 * r}, MU[r])
			VBROADCASTSS(Mem{Base: rstd, Disp: 4 * r}, R[r])
			zero(isa, sg[r])
			zero(isa, sgx[r])
		}
		wp, dwp, dbp := GP64(), GP64(), GP64()
		Load(Param("w"), wp)
		Load(Param("dw"), dwp)
		Load(Param("db"), dbp)
		ptrs := copyRegs(x, dout)
		xp, gp := ptrs[0], ptrs[1]
		colLoop(isa, d, []Register{xp, gp, wp, dwp, dbp}, func() {
			dwv, dbv := isa.vec(), isa.vec()
			VMOVUPS(Mem{Base: dwp}, dwv)
			VMOVUPS(Mem{Base: dbp}, dbv)
			for r := range nr {
				xh, g, gw := isa.vec(), isa.vec(), isa.vec()
				VMOVUPS(rowMem(xp, rowBytes, r), xh)
				VSUBPS(MU[r], xh, xh)
				VMULPS(R[r], xh, xh)
				VMOVUPS(rowMem(gp, rowBytes, r), g)
				VMULPS(Mem{Base: wp}, g, gw)
				VADDPS(gw, sg[r], sg[r])
				VFMADD231PS(gw, xh, sgx[r])
				VFMADD231PS(g, xh, dwv)
				VADDPS(g, dbv, dbv)
			}
			VMOVUPS(dwv, Mem{Base: dwp})
			VMOVUPS(dbv, Mem{Base: dbp})
		})
		MG, MGX := make([]VecVirtual, nr), make([]VecVirtual, nr)
		for r := range nr {
			mg := horizontalSum(isa, sg[r])
			VMULSS(invD, mg, mg)
			MG[r] = isa.vec()
			VBROADCASTSS(mg, MG[r])
			mgx := horizontalSum(isa, sgx[r])
			VMULSS(invD, mgx, mgx)
			MGX[r] = isa.vec()
			VBROADCASTSS(mgx, MGX[r])
		}
		Load(Param("w"), wp)
		ptrs = copyRegs(x, dout, dx)
		xp, gp, dxp := ptrs[0], ptrs[1], ptrs[2]
		colLoop(isa, d, []Register{xp, gp, wp, dxp}, func() {
			wv := isa.vec()
			VMOVUPS(Mem{Base: wp}, wv)
			for r := range nr {
				xh, t := isa.vec(), isa.vec()
				VMOVUPS(rowMem(xp, rowBytes, r), xh)
				VSUBPS(MU[r], xh, xh)
				VMULPS(R[r], xh, xh)
				VMULPS(rowMem(gp, rowBytes, r), wv, t)
				VSUBPS(MG[r], t, t)
				VFNMADD231PS(xh, MGX[r], t) // t -= xhat·mgx
				o := isa.vec()
				VMOVUPS(rowMem(dxp, rowBytes, r), o)
				VFMADD231PS(t, R[r], o) // o += rstd·t
				VMOVUPS(o, rowMem(dxp, rowBytes, r))
			}
		})
	})
	VZEROUPPER()
	RET()
}

// maxSum emits maxSum<ISA>: the largest of x[0..n) (n a positive
// multiple of the lanes) and their sum, which tells the caller whether
// there was a NaN (VMAXPS does not keep one).
func maxSum(isa vecISA) {
	name := "maxSum" + isa.suffix
	TEXT(name, NOSPLIT, "func(x *float32, n int) (mx, sum float32)")
	Doc(
		fmt.Sprintf("%s returns the largest of x[i] for i < n, a positive multiple of %d,", name, isa.lanes),
		"and their sum (NaN if one is NaN, which the maximum may not show).",
	)
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	mx, sum := isa.vec(), isa.vec()
	VMOVUPS(Mem{Base: x}, mx)
	VMOVUPS(Mem{Base: x}, sum)
	ADDQ(U8(4*isa.lanes), x)
	SUBQ(U8(isa.lanes), n)
	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	v := isa.vec()
	VMOVUPS(Mem{Base: x}, v)
	VMAXPS(v, mx, mx)
	VADDPS(v, sum, sum)
	ADDQ(U8(4*isa.lanes), x)
	SUBQ(U8(isa.lanes), n)
	JMP(LabelRef("loop"))
	Label("done")
	Store(horizontalSum(isa, sum), Return("sum"))
	Store(horizontalMax(isa, mx), Return("mx"))
	VZEROUPPER()
	RET()
}

// horizontalMax emits the largest of the lanes of v and returns the xmm
// register whose lowest lane holds it.
func horizontalMax(isa vecISA, v VecVirtual) VecVirtual {
	y := v
	if isa.lanes == 16 {
		hi := YMM()
		VEXTRACTF64X4(U8(1), v, hi)
		y = YMM()
		VMAXPS(hi, v.(Register).(VecVirtual).AsY(), y)
	}
	hi, lo := XMM(), XMM()
	VEXTRACTF128(U8(1), y, hi)
	VMAXPS(hi, y.AsX(), lo)
	sh := XMM()
	VPERMILPS(U8(0x4E), lo, sh) // swap the 64-bit halves
	VMAXPS(sh, lo, lo)
	VPERMILPS(U8(0xB1), lo, sh) // swap neighbours
	VMAXPS(sh, lo, lo)
	return lo
}

// scale emits scale<ISA>: x[i] *= s for i < n, a multiple of the lanes.
func scale(isa vecISA) {
	name := "scale" + isa.suffix
	TEXT(name, NOSPLIT, "func(x *float32, n int, s float32)")
	Doc(fmt.Sprintf("%s multiplies x[i] by s for i < n, a multiple of %d.", name, isa.lanes))
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	sv := isa.vec()
	VBROADCASTSS(Load(Param("s"), XMM()), sv)
	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	v := isa.vec()
	VMULPS(Mem{Base: x}, sv, v)
	VMOVUPS(v, Mem{Base: x})
	ADDQ(U8(4*isa.lanes), x)
	SUBQ(U8(isa.lanes), n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// vecMath emits the elementwise kernels for every vector width.
func vecMath() {
	c := mathConsts("mathconsts")
	oneConst = c("one")
	for _, isa := range vecISAs {
		expSum(isa, c)
		gelu(isa, c)
		layerNorm(isa)
		layerNormBack(isa)
		maxSum(isa)
		scale(isa)
	}
	rowSum()
}
