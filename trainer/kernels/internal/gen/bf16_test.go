package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEncodeVDPBF16PS checks the encoding against llvm-mc's
// (llvm-mc -mattr=+avx512bf16 -show-encoding).
func TestEncodeVDPBF16PS(t *testing.T) {
	for _, tc := range []struct {
		dst, src1, src2 int
		want            []byte
	}{
		{2, 1, 0, []byte{0x62, 0xf2, 0x76, 0x48, 0x52, 0xd0}},
		{9, 17, 31, []byte{0x62, 0x12, 0x76, 0x40, 0x52, 0xcf}},
		{23, 26, 24, []byte{0x62, 0x82, 0x2e, 0x40, 0x52, 0xf8}},
	} {
		require.Equal(t, tc.want, encodeVDPBF16PS(tc.dst, tc.src1, tc.src2), "zmm%d, zmm%d, zmm%d", tc.dst, tc.src1, tc.src2)
	}
}
