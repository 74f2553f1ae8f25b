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

// vdpbf16ps emits VDPBF16PS acc, x, b (Intel order: acc += the dot
// products of the bf16 pairs of x and b, lane by lane, in fp32). Neither
// Go's assembler nor avo knows AVX512_BF16, so it goes out as its EVEX
// bytes, named in a comment.
func vdpbf16ps(b, x, acc VecPhysical) {
	Comment(fmt.Sprintf("VDPBF16PS %s, %s, %s", b.Asm(), x.Asm(), acc.Asm()))
	for _, v := range encodeVDPBF16PS(int(acc.PhysicalIndex()), int(x.PhysicalIndex()), int(b.PhysicalIndex())) {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(v)}})
	}
}

// encodeVDPBF16PS is the EVEX encoding of VDPBF16PS zmm(dst), zmm(src1),
// zmm(src2): EVEX.512.F3.0F38.W0 52 /r, dst in ModRM.reg, src1 in vvvv,
// src2 in ModRM.rm, all of the register indices' high bits inverted.
func encodeVDPBF16PS(dst, src1, src2 int) []byte {
	inv := func(idx, bit int) byte { return byte(^(idx >> bit) & 1) }
	p0 := inv(dst, 3)<<7 | inv(src2, 4)<<6 | inv(src2, 3)<<5 | inv(dst, 4)<<4 | 0b010 // map 0F38
	p1 := byte(^src1&15)<<3 | 1<<2 | 0b10                                             // W0, pp = F3
	p2 := byte(0b10)<<5 | inv(src1, 4)<<3                                             // L'L = 512 bits
	modrm := byte(0b11)<<6 | byte(dst&7)<<3 | byte(src2&7)
	return []byte{0x62, p0, p1, p2, 0x52, modrm}
}

// dotLoopBF16 emits dotLoopBF16: n rounds of 24 independent VDPBF16PS on
// zmm registers, 16 lanes × 2 pairs × 2 flops each, 1536 flops a round:
// the AVX512_BF16 peak as fmaLoopAVX512 measures the fp32 one.
func dotLoopBF16() {
	TEXT("dotLoopBF16", NOSPLIT, "func(n int)")
	Doc(
		"dotLoopBF16 runs n rounds of 24 independent 16-lane bf16 pair dot products",
		"(VDPBF16PS, 1536 flops a round) on registers only. It needs AVX512_BF16.",
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
		vdpbf16ps([]VecPhysical{Z24, Z25}[i%2], Z25, r)
	}
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}
