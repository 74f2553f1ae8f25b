package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEncodeBF16 checks the encodings against llvm-mc's
// (llvm-mc -mattr=+avx512bf16 -show-encoding; Intel operand order here).
func TestEncodeBF16(t *testing.T) {
	for _, tc := range []struct {
		name            string
		encode          func(dst, src1, src2 int) []byte
		dst, src1, src2 int
		want            []byte
	}{
		{"vdpbf16ps", encodeVDPBF16PS, 2, 1, 0, []byte{0x62, 0xf2, 0x76, 0x48, 0x52, 0xd0}},
		{"vdpbf16ps", encodeVDPBF16PS, 9, 17, 31, []byte{0x62, 0x12, 0x76, 0x40, 0x52, 0xcf}},
		{"vdpbf16ps", encodeVDPBF16PS, 23, 26, 24, []byte{0x62, 0x82, 0x2e, 0x40, 0x52, 0xf8}},
		{"vcvtne2ps2bf16", encodeVCVTNE2PS2BF16, 0, 1, 2, []byte{0x62, 0xf2, 0x77, 0x48, 0x72, 0xc2}},
		{"vcvtne2ps2bf16", encodeVCVTNE2PS2BF16, 9, 17, 31, []byte{0x62, 0x12, 0x77, 0x40, 0x72, 0xcf}},
		{"vcvtne2ps2bf16", encodeVCVTNE2PS2BF16, 23, 26, 8, []byte{0x62, 0xc2, 0x2f, 0x40, 0x72, 0xf8}},
	} {
		require.Equal(t, tc.want, tc.encode(tc.dst, tc.src1, tc.src2), "%s zmm%d, zmm%d, zmm%d", tc.name, tc.dst, tc.src1, tc.src2)
	}
}
