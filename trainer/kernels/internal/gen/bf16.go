package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// bf16Tile is the 12×32 AVX512_BF16 micro-kernel: avx512Tile's registers
// and loop, with a step of two k (a bf16 pair in each 32-bit element of
// the panels, broadcast as one float would be) and VDPBF16PS for the
// multiply-add.
var bf16Tile = tileSpec{name: "kernelBF16", mr: mr512, nvec: 2, lanes: 16,
	regs: avx512Tile.regs, zero: avx512Tile.zero, madd: vdpbf16ps, pairs: true}

// bf16NarrowTile is bf16Tile one vector wide, 12×16, for products of at
// most 16 columns (the attention heads' P·v and gradients), where the
// 12×32 tile would compute half its columns for nothing.
var bf16NarrowTile = tileSpec{name: "kernelBF16Narrow", mr: mr512, nvec: 1, lanes: 16,
	regs: avx512Tile.regs, zero: avx512Tile.zero, madd: vdpbf16ps, pairs: true}

// vdpbf16ps emits VDPBF16PS acc, x, b (Intel order: acc += the dot
// products of the bf16 pairs of x and b, lane by lane, in fp32). Neither
// Go's assembler nor avo knows AVX512_BF16, so it goes out as its EVEX
// bytes, named in a comment.
func vdpbf16ps(b, x, acc VecPhysical) {
	rawInstruction(fmt.Sprintf("VDPBF16PS %s, %s, %s", b.Asm(), x.Asm(), acc.Asm()),
		encodeVDPBF16PS(int(acc.PhysicalIndex()), int(x.PhysicalIndex()), int(b.PhysicalIndex())))
}

// vcvtne2ps2bf16 emits VCVTNE2PS2BF16 lo, hi, dst: the 16 floats of lo
// and then the 16 of hi rounded to bf16 (to nearest even, subnormals to
// zero), in order, as the 32 words of dst.
func vcvtne2ps2bf16(lo, hi, dst VecPhysical) {
	rawInstruction(fmt.Sprintf("VCVTNE2PS2BF16 %s, %s, %s", lo.Asm(), hi.Asm(), dst.Asm()),
		encodeVCVTNE2PS2BF16(int(dst.PhysicalIndex()), int(hi.PhysicalIndex()), int(lo.PhysicalIndex())))
}

// rawInstruction emits the bytes of an instruction Go's assembler does
// not know, after a comment naming it.
func rawInstruction(name string, bytes []byte) {
	Comment(name)
	for _, v := range bytes {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(v)}})
	}
}

// encodeVDPBF16PS is the EVEX encoding of VDPBF16PS zmm(dst), zmm(src1),
// zmm(src2): EVEX.512.F3.0F38.W0 52 /r.
func encodeVDPBF16PS(dst, src1, src2 int) []byte {
	return encodeEVEX512(ppF3, 0x52, dst, src1, src2)
}

// encodeVCVTNE2PS2BF16 is the EVEX encoding of VCVTNE2PS2BF16 zmm(dst),
// zmm(src1), zmm(src2) (Intel order: the low half of dst from src2, the
// high half from src1): EVEX.512.F2.0F38.W0 72 /r.
func encodeVCVTNE2PS2BF16(dst, src1, src2 int) []byte {
	return encodeEVEX512(ppF2, 0x72, dst, src1, src2)
}

// The EVEX pp field: the legacy prefix an instruction implies.
const (
	ppF3 = 0b10
	ppF2 = 0b11
)

// encodeEVEX512 is the EVEX encoding of a 512-bit, W0, map 0F38
// instruction op on registers only: dst in ModRM.reg, src1 in vvvv, src2
// in ModRM.rm, the high bits of each register index inverted.
func encodeEVEX512(pp, op byte, dst, src1, src2 int) []byte {
	inv := func(idx, bit int) byte { return byte(^(idx >> bit) & 1) }
	p0 := inv(dst, 3)<<7 | inv(src2, 4)<<6 | inv(src2, 3)<<5 | inv(dst, 4)<<4 | 0b010 // map 0F38
	p1 := byte(^src1&15)<<3 | 1<<2 | pp                                               // W0
	p2 := byte(0b10)<<5 | inv(src1, 4)<<3                                             // L'L = 512 bits
	modrm := byte(0b11)<<6 | byte(dst&7)<<3 | byte(src2&7)
	return []byte{0x62, p0, p1, p2, op, modrm}
}

// cvtPairsBF16 emits cvtPairsBF16: n floats, a multiple of 16, rounded to
// bf16 in order, so that each uint32 of the result is the pair of two
// consecutive floats, the even one in its low half: 32 floats a
// VCVTNE2PS2BF16, and a last 16 with zeros for the high half.
func cvtPairsBF16() {
	TEXT("cvtPairsBF16", NOSPLIT, "func(dst *uint32, src *float32, n int)")
	Doc(
		"cvtPairsBF16 rounds the n floats at src (n a multiple of 16) to bf16 (to",
		"nearest even, subnormals to zero) and stores them in order at dst: dst[i]",
		"holds src[2i] in its low half and src[2i+1] in its high half. It needs",
		"AVX512_BF16.",
	)
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	Label("loop")
	CMPQ(n, U8(32))
	JL(LabelRef("half"))
	VMOVUPS(Mem{Base: src}, Z0)
	VMOVUPS(Mem{Base: src, Disp: 64}, Z1)
	vcvtne2ps2bf16(Z0, Z1, Z2)
	VMOVDQU32(Z2, Mem{Base: dst})
	ADDQ(U32(128), src)
	ADDQ(U8(64), dst)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop"))
	Label("half")
	TESTQ(n, n)
	JE(LabelRef("done"))
	VMOVUPS(Mem{Base: src}, Z0)
	VPXORD(Z1, Z1, Z1)
	vcvtne2ps2bf16(Z0, Z1, Z2)
	VMOVDQU32(Y2, Mem{Base: dst})
	Label("done")
	VZEROUPPER()
	RET()
}

// interleaveWords emits the VPERMW index that interleaves the two halves
// of a zmm of words: word 2i of the result is word i, word 2i+1 is word
// 16+i.
func interleaveWords() Mem {
	table := GLOBL("bf16interleave", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(4*i, U16(i))
		DATA(4*i+2, U16(16+i))
	}
	return table
}

// packColsBF16 emits packCols{w}BF16 for w = 12, 16 or 32: it packs pairs of
// rows of a w-column panel as bf16 pairs, each pair of rows converted by
// one VCVTNE2PS2BF16 (even row low, odd row high) and interleaved by one
// VPERMW.
func packColsBF16(w int, interleave Mem) {
	name := fmt.Sprintf("packCols%dBF16", w)
	TEXT(name, NOSPLIT, "func(dst *uint32, src *float32, ld int, pairs int)")
	Doc(
		fmt.Sprintf("%s packs pairs pairs of rows of %d floats at src (row stride ld", name, w),
		"floats), rounded to bf16 (to nearest even, subnormals to zero), into dst:",
		fmt.Sprintf("dst[%d*p+r] holds src[2p*ld+r] in its low half and src[(2p+1)*ld+r] in", w),
		"its high half. It needs AVX512_BF16.",
	)
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	ld := Load(Param("ld"), GP64())
	n := Load(Param("pairs"), GP64())
	SHLQ(U8(2), ld)
	VMOVDQU32(interleave, Z31)
	if w == 12 {
		mask := GP32()
		MOVL(U32(0xfff), mask)
		KMOVW(mask, K1)
	}
	Label("loop")
	TESTQ(n, n)
	JE(LabelRef("done"))
	regs := [][4]VecPhysical{{Z0, Z1, Z2, Z3}, {Z4, Z5, Z6, Z7}}
	for h := 0; h < (w+15)/16; h++ {
		even, odd, cvt, out := regs[h][0], regs[h][1], regs[h][2], regs[h][3]
		evenAt, oddAt := Mem{Base: src, Disp: 64 * h}, Mem{Base: src, Index: ld, Scale: 1, Disp: 64 * h}
		if w == 12 {
			VMOVUPS_Z(evenAt, K1, even)
			VMOVUPS_Z(oddAt, K1, odd)
		} else {
			VMOVUPS(evenAt, even)
			VMOVUPS(oddAt, odd)
		}
		vcvtne2ps2bf16(even, odd, cvt)
		VPERMW(cvt, Z31, out)
		if w == 12 {
			VMOVDQU32(out.AsY(), Mem{Base: dst})
			VEXTRACTI32X4(U8(2), out, Mem{Base: dst, Disp: 32})
		} else {
			VMOVDQU32(out, Mem{Base: dst, Disp: 64 * h})
		}
	}
	LEAQ(Mem{Base: src, Index: ld, Scale: 2}, src)
	ADDQ(U8(4*w), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// dotLoopBF16 emits dotLoopBF16: n rounds of 24 independent VDPBF16PS on
// zmm registers, 16 lanes × 2 pairs × 2 flops each, 1536 flops a round:
// the AVX512_BF16 peak as fmaLoopAVX512 measures the fp32 one.
func dotLoopBF16() {
	peakLoop512("dotLoopBF16", []string{
		"dotLoopBF16 runs n rounds of 24 independent 16-lane bf16 pair dot products",
		"(VDPBF16PS, 1536 flops a round) on registers only. It needs AVX512_BF16.",
	}, vdpbf16ps)
}
