package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// adamwConsts are the float64 constants the adamw kernels read at c, in
// this order, each repeated 8 times (64 bytes) so that an instruction of
// either width takes it as a whole-register memory operand. The Go side
// (adamwTable in package kernels) lays them out the same way.
var adamwConsts = []string{"lr", "beta1", "oneMinusBeta1", "beta2", "oneMinusBeta2", "bc1", "bc2", "eps", "shrink", "clip"}

// adamwISA is one vector width of the AdamW kernel: doubles lanes wide
// registers of float64 and the half-width registers their float32 fill.
type adamwISA struct {
	suffix string
	lanes  int               // float64 per register
	wide   func() VecVirtual // lanes float64
	narrow func() VecVirtual // lanes float32
	// toFloat32 converts wide's lanes to float32 in narrow.
	toFloat32 func(wide, narrow VecVirtual)
	// decayed emits p = p·shrink in the lanes whose byte of decay (at
	// mask, lanes bytes) is not zero, p unchanged in the others.
	decayed func(p VecVirtual, mask, shrink Mem)
}

var adamwISAs = []adamwISA{
	{suffix: "AVX2", lanes: 4, wide: YMM, narrow: XMM,
		toFloat32: func(w, n VecVirtual) { VCVTPD2PSY(w, n) },
		decayed: func(p VecVirtual, mask, shrink Mem) {
			sel, scaled := YMM(), YMM()
			VPMOVZXBQ(mask, sel)
			VPSLLQ(U8(63), sel, sel) // a decayed lane's sign bit set
			VMULPD(shrink, p, scaled)
			VBLENDVPD(sel, scaled, p, p)
		}},
	{suffix: "AVX512", lanes: 8, wide: ZMM, narrow: YMM,
		toFloat32: func(w, n VecVirtual) { VCVTPD2PS(w, n) },
		decayed: func(p VecVirtual, mask, shrink Mem) {
			sel := ZMM()
			VPMOVZXBQ(mask, sel)
			VPTESTMQ(sel, sel, K1)
			VMULPD(shrink, p, K1, p) // merge-masked: other lanes keep p
		}},
}

// adamwKernels emits adamwAVX2 and adamwAVX512.
func adamwKernels() {
	for _, isa := range adamwISAs {
		adamw(isa)
	}
}

// adamw emits adamw<ISA>: the AdamW update of package kernels' goAdamW,
// lanes elements at a time, every operation a separately rounded float64
// instruction in the same order as the Go code (no fused multiply-add),
// so its results are the same bits.
func adamw(isa adamwISA) {
	name := "adamw" + isa.suffix
	TEXT(name, NOSPLIT, "func(params, m, v, grads *float32, decay *bool, n int, c *float64)")
	Doc(
		fmt.Sprintf("%s applies goAdamW's update to the first n elements (a multiple of %d)", name, isa.lanes),
		"of params, m and v from grads, with decay where decay[i] (decay nil: nowhere),",
		"the step's constants at c as adamwTable lays them out. Its results are",
		"goAdamW's bits.",
	)
	p := Load(Param("params"), GP64())
	m := Load(Param("m"), GP64())
	v := Load(Param("v"), GP64())
	g := Load(Param("grads"), GP64())
	decay := Load(Param("decay"), GP64())
	n := Load(Param("n"), GP64())
	c := Load(Param("c"), GP64())
	at := map[string]Mem{}
	for i, k := range adamwConsts {
		at[k] = Mem{Base: c, Disp: 64 * i}
	}
	i := GP64()
	XORQ(i, i)
	TESTQ(decay, decay)
	JE(LabelRef("plain"))
	adamwLoop(isa, "decayed", p, m, v, g, decay, i, n, at)
	Label("plain")
	adamwLoop(isa, "undecayed", p, m, v, g, nil, i, n, at)
	VZEROUPPER()
	RET()
}

// adamwLoop emits the loop of adamw over elements i..n-1, labelled
// label, applying decay when decay is not nil; it falls through at the
// end to label+"Done".
func adamwLoop(isa adamwISA, label string, p, m, v, g, decay, i, n Register, at map[string]Mem) {
	f32 := func(base Register) Mem { return Mem{Base: base, Index: i, Scale: 4} }
	Label(label)
	CMPQ(i, n)
	JGE(LabelRef(label + "Done"))
	grad, pp, mm, vv, t := isa.wide(), isa.wide(), isa.wide(), isa.wide(), isa.wide()
	VCVTPS2PD(f32(g), grad)
	VMULPD(at["clip"], grad, grad) // g = clip·grad
	VCVTPS2PD(f32(p), pp)
	if decay != nil {
		isa.decayed(pp, Mem{Base: decay, Index: i, Scale: 1}, at["shrink"])
	}
	VCVTPS2PD(f32(m), mm)
	VMULPD(at["beta1"], mm, mm)
	VMULPD(at["oneMinusBeta1"], grad, t)
	VADDPD(t, mm, mm) // m = beta1·m + (1-beta1)·g
	VCVTPS2PD(f32(v), vv)
	VMULPD(at["beta2"], vv, vv)
	VMULPD(at["oneMinusBeta2"], grad, t)
	VMULPD(grad, t, t)
	VADDPD(t, vv, vv) // v = beta2·v + ((1-beta2)·g)·g
	out := isa.narrow()
	isa.toFloat32(mm, out)
	VMOVUPS(out, f32(m))
	isa.toFloat32(vv, out)
	VMOVUPS(out, f32(v))
	VDIVPD(at["bc2"], vv, vv)
	VSQRTPD(vv, vv)
	VADDPD(at["eps"], vv, vv) // sqrt(v/bc2) + eps
	VDIVPD(at["bc1"], mm, mm)
	VMULPD(at["lr"], mm, mm) // lr·(m/bc1)
	VDIVPD(vv, mm, mm)
	VSUBPD(mm, pp, pp)
	isa.toFloat32(pp, out)
	VMOVUPS(out, f32(p))
	ADDQ(U8(isa.lanes), i)
	JMP(LabelRef(label))
	Label(label + "Done")
}
