package slurm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTasksPerNode(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"1", []int{1}},
		{"4", []int{4}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"2(x4)", []int{2, 2, 2, 2}},
		{"4,1", []int{4, 1}},
		{"1(x2),3,2(x1)", []int{1, 1, 3, 2}},
		{"0,1", []int{0, 1}},
		{"08(x02)", []int{8, 8}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTasksPerNode(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseTasksPerNodeErrors(t *testing.T) {
	tests := []struct {
		in, msg string
	}{
		{"", `slurm: tasks per node "": empty`},
		{"2(x3", `slurm: tasks per node "2(x3": item "2(x3": want N or N(xM)`},
		{"2(3)", `slurm: tasks per node "2(3)": item "2(3)": want N or N(xM)`},
		{"2(x)", `slurm: tasks per node "2(x)": item "2(x)": want N or N(xM)`},
		{"2(x0)", `slurm: tasks per node "2(x0)": item "2(x0)": repeat count must be at least 1`},
		{"(x2)", `slurm: tasks per node "(x2)": item "(x2)": want N or N(xM)`},
		{"2,,1", `slurm: tasks per node "2,,1": item "": want N or N(xM)`},
		{"2,", `slurm: tasks per node "2,": item "": want N or N(xM)`},
		{"-1", `slurm: tasks per node "-1": item "-1": want N or N(xM)`},
		{"2 ,1", `slurm: tasks per node "2 ,1": item "2 ": want N or N(xM)`},
		{"a", `slurm: tasks per node "a": item "a": want N or N(xM)`},
		{"2(x3)x", `slurm: tasks per node "2(x3)x": item "2(x3)x": want N or N(xM)`},
		{"99999999999999999999", `slurm: tasks per node "99999999999999999999": item "99999999999999999999": count too large`},
		{"1(x99999999999999999999)", `slurm: tasks per node "1(x99999999999999999999)": item "1(x99999999999999999999)": repeat count too large`},
		{"1(x1048576),1", `slurm: tasks per node "1(x1048576),1": more than 1048576 nodes`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTasksPerNode(tt.in)
			require.Nil(t, got)
			require.EqualError(t, err, tt.msg)
		})
	}
}
