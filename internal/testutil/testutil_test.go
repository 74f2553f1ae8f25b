package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB that records Skipf and Fatalf instead of ending
// the goroutine, so SkipOrFail's two outcomes can be seen from one test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) { r.skipped = fmt.Sprintf(format, args...) }

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestSkipOrFail(t *testing.T) {
	tests := []struct {
		name            string
		ci              string
		skipped, failed string
	}{
		{"not CI skips", "", "needs scontrol (apt-get install slurm-client)", ""},
		{"CI=false skips", "false", "needs scontrol (apt-get install slurm-client)", ""},
		{"CI=true fails", "true", "", "CI=true, and a dependency is missing: needs scontrol (apt-get install slurm-client)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			SkipOrFail(r, "needs %s (apt-get install %s)", "scontrol", "slurm-client")
			require.Equal(t, tc.skipped, r.skipped)
			require.Equal(t, tc.failed, r.failed)
		})
	}
}

func TestTorchRequire(t *testing.T) {
	tests := []struct {
		name    string
		python  string
		want    string
		skipped string // a prefix of the skip message; "" when it must not skip
	}{
		{"an interpreter that imports it", "/bin/true", "/bin/true", ""},
		{"an interpreter that fails", "/bin/false", "/bin/false", "needs PyTorch (apt-get install python3-torch): /bin/false cannot import torch.distributed: exit status 1"},
		{"no interpreter", "/nonexistent/python3", "/nonexistent/python3", "needs PyTorch (apt-get install python3-torch): /nonexistent/python3 cannot import"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", "")
			p := &Torch{Python: tc.python}
			for range 2 { // the second call reuses the probe's answer
				r := &recorder{TB: t}
				require.Equal(t, tc.want, p.Require(r))
				require.True(t, strings.HasPrefix(r.skipped, tc.skipped), "skipped: %q", r.skipped)
				if tc.skipped == "" {
					require.Empty(t, r.skipped)
				}
			}
		})
	}
}

func TestTorchDefaultsToDebianPython(t *testing.T) {
	t.Setenv("CI", "")
	var p Torch
	p.Require(&recorder{TB: t})
	require.Equal(t, DebianPython, p.Python)
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(5)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, port := range ports {
		require.False(t, seen[port], "port %d twice", port)
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		require.NoError(t, err)
		require.NoError(t, l.Close())
	}
	require.Positive(t, FreePort(t))
}

// TestOnRanksRunsEveryRankAtOnce: every rank waits for all the others
// before it returns, which only ranks run at the same time can do.
func TestOnRanksRunsEveryRankAtOnce(t *testing.T) {
	const size = 5
	var started sync.WaitGroup
	started.Add(size)
	errs := OnRanks(size, func(r int) error {
		started.Done()
		started.Wait()
		if r%2 == 1 {
			return fmt.Errorf("rank %d failed", r)
		}
		return nil
	})
	require.Equal(t, []error{nil, errors.New("rank 1 failed"), nil, errors.New("rank 3 failed"), nil}, errs)
}

func TestRequireRanks(t *testing.T) {
	RequireRanks(t, OnRanks(3, func(int) error { return nil }))
	RequireRanks(t, nil)
}

// TestNoCommandLinksTestutil: testutil imports package testing, so no
// gorun command may depend on it.
func TestNoCommandLinksTestutil(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", "github.com/gorun/gorun/cmd/...").CombinedOutput()
	require.NoError(t, err, string(out))
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/gorun/gorun/cmd/gorun")
	require.NotContains(t, deps, "github.com/gorun/gorun/internal/testutil")
}
