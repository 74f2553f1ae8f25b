package distenv

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func sample() Worker {
	return Worker{
		Rank: 5, LocalRank: 1, WorldSize: 8, LocalWorldSize: 4, GroupRank: 1, GroupWorldSize: 2,
		RoleName: "default", MasterAddr: "node1", MasterPort: 29500, RestartCount: 2,
		MaxRestarts: 3, RunID: "42", ErrorFile: "/tmp/e.json",
	}
}

func envLookup(env []string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for _, kv := range env {
			if name, v, ok := strings.Cut(kv, "="); ok && name == k {
				return v, true
			}
		}
		return "", false
	}
}

func TestEnvironRoundTrip(t *testing.T) {
	w := sample()
	w.VisibleGPUs = []string{"0", "1", "2", "3"}
	env := w.Environ([]string{"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=4"})
	got, err := FromEnv(envLookup(env))
	require.NoError(t, err)
	require.Equal(t, w, got)

	look := envLookup(env)
	for k, want := range map[string]string{
		"PATH": "/bin", "RANK": "5", "OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		"ROLE_RANK": "5", "ROLE_WORLD_SIZE": "8", "TORCHELASTIC_USE_AGENT_STORE": "False",
		"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONUNBUFFERED": "1",
	} {
		v, ok := look(k)
		require.True(t, ok, k)
		require.Equal(t, want, v, k)
	}
	count := 0
	for _, kv := range env {
		if strings.HasPrefix(kv, "RANK=") {
			count++
		}
	}
	require.Equal(t, 1, count, "RANK is set exactly once")
}

func TestNoGPUsLeavesCudaVisibleDevicesAlone(t *testing.T) {
	env := sample().Environ([]string{"CUDA_VISIBLE_DEVICES=7"})
	v, _ := envLookup(env)("CUDA_VISIBLE_DEVICES")
	require.Equal(t, "7", v)
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Worker)
		want   string
	}{
		{"ok", func(*Worker) {}, ""},
		{"rank too big", func(w *Worker) { w.Rank = 8 }, "rank 8 outside world size 8"},
		{"local rank", func(w *Worker) { w.LocalRank = 4 }, "local rank 4"},
		{"node rank", func(w *Worker) { w.GroupRank = -1 }, "node rank -1"},
		{"no master", func(w *Worker) { w.MasterAddr = "" }, "master"},
		{"bad port", func(w *Worker) { w.MasterPort = 70000 }, "master"},
		{"empty world", func(w *Worker) { w.WorldSize = 0 }, "world size 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := sample()
			tc.mutate(&w)
			err := w.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestFromEnvErrors(t *testing.T) {
	env := sample().Environ(nil)
	drop := func(name string) []string {
		var out []string
		for _, kv := range env {
			if !strings.HasPrefix(kv, name+"=") {
				out = append(out, kv)
			}
		}
		return out
	}
	_, err := FromEnv(envLookup(drop("WORLD_SIZE")))
	require.ErrorContains(t, err, "WORLD_SIZE is not set")
	_, err = FromEnv(envLookup(append(drop("RANK"), "RANK=x")))
	require.ErrorContains(t, err, `RANK="x" is not an integer`)
}

// torchrun sets OMP_NUM_THREADS=1 only when several workers share the
// node and the user did not set it.
func TestOMPNumThreads(t *testing.T) {
	for _, tt := range []struct {
		name     string
		local    int
		base     []string
		want     string
		wantSeen bool
	}{
		{"several workers", 2, nil, "1", true},
		{"one worker", 1, nil, "", false},
		{"user's value kept", 4, []string{"OMP_NUM_THREADS=8"}, "8", true},
		{"user's value with one worker", 1, []string{"OMP_NUM_THREADS=8"}, "8", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := sample()
			w.LocalRank, w.LocalWorldSize = 0, tt.local
			v, ok := envLookup(w.Environ(tt.base))("OMP_NUM_THREADS")
			require.Equal(t, tt.wantSeen, ok)
			require.Equal(t, tt.want, v)
		})
	}
}

func TestVirtualLocalRank(t *testing.T) {
	w := sample()
	w.VirtualLocalRank, w.VisibleGPUs = true, []string{"GPU-abc"}
	look := envLookup(w.Environ([]string{"CUDA_VISIBLE_DEVICES=0,1"}))
	v, _ := look("LOCAL_RANK")
	require.Equal(t, "0", v)
	v, _ = look("CUDA_VISIBLE_DEVICES")
	require.Equal(t, "GPU-abc", v)
}
