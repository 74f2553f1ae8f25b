package commbench

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(WorkerEnv); ok { // re-executed as one rank
		if err := RunWorker(context.Background(), os.LookupEnv, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSpecs(t *testing.T) {
	specs := Specs([]string{"allreduce"}, []int64{4 << 10, 1000, 2, 256 << 20}, 4)
	require.Equal(t, []Spec{
		{Op: "allreduce", Bytes: 4 << 10, Iters: 100},
		{Op: "allreduce", Bytes: 992, Iters: 100},
		{Op: "allreduce", Bytes: 256 << 20, Iters: 2},
	}, specs)
	back, err := DecodeSpecs(EncodeSpecs(specs))
	require.NoError(t, err)
	require.Equal(t, specs, back)
	for _, bad := range []string{"", "allreduce:1", "allreduce:x:1", "allreduce:0:1", "allreduce:4:-1"} {
		_, err := DecodeSpecs(bad)
		require.Error(t, err, bad)
	}
}

func TestBusBandwidth(t *testing.T) {
	for _, tc := range []struct {
		op    string
		ranks int
		want  float64 // busbw for 1 GB in 1 s
	}{
		{"allreduce", 2, 1}, {"allreduce", 4, 1.5}, {"reducescatter", 4, 0.75}, {"allgather", 2, 0.5},
	} {
		r := Result{Op: tc.op, Ranks: tc.ranks, Bytes: 1e9, Iters: 2, Seconds: 2}
		r.fill()
		require.InDelta(t, 1.0, r.AlgBW, 1e-12, tc.op)
		require.InDelta(t, tc.want, r.BusBW, 1e-12, "%s on %d ranks", tc.op, tc.ranks)
	}
}

// TestRun runs our side for real: the ranks are this test binary
// re-executed.
func TestRun(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	var log bytes.Buffer
	results, err := Run(context.Background(), Options{
		Ranks: []int{2, 3}, Sizes: []int64{4 << 10, 256 << 10}, Ops: DefaultOps(),
		Self: []string{self}, Rounds: 2, Stderr: &log,
	})
	require.NoError(t, err, log.String())
	require.Len(t, results, 2*3*2, "ranks x ops x sizes, best of the rounds")
	for _, r := range results {
		require.Equal(t, "gorun", r.Impl)
		require.Empty(t, r.Error, "%+v", r)
		require.Positive(t, r.BusBW, "%+v", r)
	}
}

// TestGloo runs the gloo script for real with /usr/bin/python3: skipped
// without torch, or failed when CI=true.
func TestGloo(t *testing.T) {
	torch := testutil.Torch{Python: testutil.DebianPython}
	python := torch.Require(t)
	var log bytes.Buffer
	results, err := Run(context.Background(), Options{
		Ranks: []int{2}, Sizes: []int64{64 << 10}, Ops: DefaultOps(),
		Self: []string{"true"}, Python: python, Rounds: 1, Stderr: &log,
		skipOurs: true,
	})
	require.NoError(t, err, log.String())
	require.Len(t, results, 3)
	for _, r := range results {
		require.Equal(t, "gloo", r.Impl)
		if r.Op == "reducescatter" {
			require.Contains(t, r.Error, "does not support", "gloo of torch 1.13 has no reduce_scatter")
			continue
		}
		require.Empty(t, r.Error, "%+v", r)
		require.Positive(t, r.BusBW, "%+v", r)
	}
}
