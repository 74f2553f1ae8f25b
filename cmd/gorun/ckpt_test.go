package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/checkpoint/ckptbench"
)

// runCkpt runs `gorun ckpt ARGS...` in-process and returns exit code, stdout and stderr.
func runCkpt(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	app := NewApp()
	var stdout, stderr bytes.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	code := exitCode(app, app.RunContext(context.Background(), append([]string{"gorun", "ckpt"}, args...)))
	return code, stdout.String(), stderr.String()
}

// saveCkpt saves tensor w (values from f) as step into dir at layout world, one goroutine per rank.
func saveCkpt(t *testing.T, dir string, world checkpoint.World, step int64, n int64, f func(i int64) float32) {
	t.Helper()
	full := make([]float32, n)
	for i := range full {
		full[i] = f(int64(i))
	}
	group := checkpoint.NewLocalGroup(world.Size())
	errs := make([]error, world.Size())
	var wg sync.WaitGroup
	for r := range group {
		wg.Go(func() {
			s, err := checkpoint.NewSaver(checkpoint.Config{Dir: dir, World: world, Coord: group[r], BlockBytes: 4096})
			if err != nil {
				errs[r] = err
				return
			}
			_, shard := world.Coords(r)
			lo, hi := checkpoint.ShardRange(n, shard, world.Shards)
			errs[r] = s.Save(context.Background(), checkpoint.Meta{Step: step, SampleIndex: step * 8, ConfigHash: "abc"},
				[]checkpoint.Tensor{{Name: "w", Shape: []int64{n}, Offset: lo, Data: full[lo:hi]}, {Name: "b", Shape: []int64{3}, Data: []float32{1, 2, 3}[:hi2(shard)]}})
		})
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// hi2 gives shard 0 all of the small tensor b and the others none.
func hi2(shard int) int {
	if shard == 0 {
		return 3
	}
	return 0
}

func TestCkptCommands(t *testing.T) {
	root := t.TempDir()
	a, b, c := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")
	value := func(i int64) float32 { return float32(i%97) - 40 }
	saveCkpt(t, a, checkpoint.World{Replicas: 2, Shards: 2, Mode: "hsdp"}, 100, 30011, value)
	saveCkpt(t, b, checkpoint.World{Replicas: 1, Shards: 3, Mode: "fsdp"}, 100, 30011, value)
	saveCkpt(t, c, checkpoint.World{Replicas: 1, Shards: 1}, 100, 30011, func(i int64) float32 { return value(i) * 1.001 })
	require.NoError(t, os.MkdirAll(filepath.Join(a, ".tmp-step-00000200-0123"), 0o755))

	code, out, errOut := runCkpt(t, "list", a)
	require.Zero(t, code, errOut)
	require.Regexp(t, `step-00000100\s+100\s+complete`, out)
	require.Contains(t, out, "2x2 hsdp")
	require.Regexp(t, `\.tmp-step-00000200-0123\s+200\s+incomplete \(a save that did not commit\)`, out)

	code, out, errOut = runCkpt(t, "verify", a)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "step-00000100: ok: 2 tensors, 30014 elements each stored once, 4 files")

	code, out, errOut = runCkpt(t, "inspect", filepath.Join(a, "step-00000100"))
	require.Zero(t, code, errOut)
	for _, want := range []string{"step          100", "sample index  800", `layout        2x2 hsdp \(4 ranks\)`, "config hash   abc", `w\s+float32\s+\[30011\]\s+30011`, `shard-00003.bin\s+3`} {
		require.Regexp(t, want, out)
	}

	// 2x2 against 1x3 holding the same values: equal, exit 0.
	code, out, errOut = runCkpt(t, "diff", a, filepath.Join(b, "step-00000100"))
	require.Zero(t, code, "%s%s", out, errOut)
	require.Contains(t, out, "equal: 2 tensors within rtol 0")

	// A relative difference of ~1e-3: differs at rtol 0 and 1e-4, equal at 2e-3.
	code, out, errOut = runCkpt(t, "diff", a, c)
	require.Equal(t, 1, code)
	require.Regexp(t, `w\s+\[30011\]\s+0\.0\d+\s+0\.000999\d*\s+\d+\s+DIFFERS`, out)
	require.Contains(t, errOut, "1 of 2 tensors differ (rtol 0, atol 0)")
	code, _, _ = runCkpt(t, "diff", "--rtol=1e-4", a, c)
	require.Equal(t, 1, code)
	code, out, _ = runCkpt(t, "diff", "--rtol=2e-3", a, c)
	require.Zero(t, code, out)
	// |a-b| is at most 0.056 (at |b| = 56): --atol 0.06 alone covers it, 0.01 alone does not,
	// and 0.01 plus rtol 1e-3 of |b| does.
	code, out, _ = runCkpt(t, "diff", "--atol=0.06", a, c)
	require.Zero(t, code, out)
	require.Contains(t, out, "equal: 2 tensors within rtol 0, atol 0.06")
	code, _, _ = runCkpt(t, "diff", "--atol=0.01", a, c)
	require.Equal(t, 1, code)
	code, out, _ = runCkpt(t, "diff", "--atol=0.01", "--rtol=1e-3", a, c)
	require.Zero(t, code, out)
	// --norm: ||a-b||/||b|| is 0.001/1.001 for w, 0 for b.
	code, out, errOut = runCkpt(t, "diff", "--norm", "--rtol=1e-3", a, c)
	require.Zero(t, code, "%s%s", out, errOut)
	require.Regexp(t, `w\s+\[30011\]\s+0\.000999\d*\s+0\.0\d+\s*\n`, out)
	require.Regexp(t, `GROUP\s+TENSORS\s+L2_REL\s*\nparams\s+2\s+0\.000\d+\s*\n`, out)
	require.Contains(t, out, "equal: 1 groups of 2 tensors within rtol 0.001, atol 0, L2 norm per group")
	code, out, errOut = runCkpt(t, "diff", "--norm", "--rtol=1e-4", a, c)
	require.Equal(t, 1, code)
	require.Regexp(t, `w\s+\[30011\]\s+0\.000999\d*\s+0\.0\d+\s+above tolerance`, out)
	require.Regexp(t, `params\s+2\s+0\.000\d+\s+DIFFERS`, out)
	require.Contains(t, errOut, "1 of 1 groups differ (rtol 0.0001, atol 0, L2 norm per group)")

	// One flipped byte: verify names the file and tensor and fails.
	m, err := checkpoint.ReadManifest(filepath.Join(a, "step-00000100"))
	require.NoError(t, err)
	var victim checkpoint.Chunk
	for _, ch := range m.Tensors[0].Chunks {
		if ch.File == "shard-00001.bin" {
			victim = ch
		}
	}
	path := filepath.Join(a, "step-00000100", victim.File)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[victim.ByteOffset+5] ^= 1
	require.NoError(t, os.WriteFile(path, data, 0o644))
	code, out, errOut = runCkpt(t, "verify", filepath.Join(a, "step-00000100"))
	require.Equal(t, 1, code)
	require.Contains(t, out, "step-00000100: CORRUPT")
	require.Contains(t, out, "shard-00001.bin tensor w: crc32c mismatch")
	require.Contains(t, errOut, "1 of 1 checkpoints corrupt")
	code, _, errOut = runCkpt(t, "diff", a, b)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "shard-00001.bin tensor w: crc32c mismatch")
}

// gorun ckpt bench prints one JSON line of timings.
func TestCkptBench(t *testing.T) {
	code, out, errOut := runCkpt(t, "bench", "--dir", filepath.Join(t.TempDir(), "b"), "--bytes", "4096", "--ranks", "2")
	require.Equal(t, 0, code, errOut)
	var res ckptbench.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, ckptbench.Result{Ranks: 2, Bytes: 4096}, ckptbench.Result{Ranks: res.Ranks, Bytes: res.Bytes})
	require.Positive(t, res.SaveSeconds)
}

func TestCkptBadInput(t *testing.T) {
	empty := t.TempDir()
	noManifest := filepath.Join(t.TempDir(), "step-00000002")
	require.NoError(t, os.Mkdir(noManifest, 0o755))
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"list"}, 2, "ckpt list: give one checkpoint directory"},
		{[]string{"list", filepath.Join(empty, "nope")}, 2, "is not a directory"},
		{[]string{"verify", empty}, 1, "no complete checkpoint in"},
		{[]string{"inspect", empty}, 1, "no complete checkpoint"},
		{[]string{"inspect", filepath.Join(empty, "step-00000001")}, 1, "step-00000001 does not exist"},
		{[]string{"inspect", noManifest}, 1, "step-00000002 has no manifest.json: not a complete checkpoint"},
		{[]string{"diff", empty}, 2, "give two checkpoints"},
		{[]string{"diff", "--rtol=-1", empty, empty}, 2, "--rtol=-1 must be 0 or more"},
		{[]string{"diff", "--atol=-0.5", empty, empty}, 2, "--atol=-0.5 must be 0 or more"},
		{[]string{"diff", filepath.Join(empty, "nope"), empty}, 1, "checkpoint: " + filepath.Join(empty, "nope") + " does not exist"},
		{[]string{"diff", noManifest, empty}, 1, "has no manifest.json"},
		{[]string{"diff", empty, empty}, 1, "no complete checkpoint in"},
		{[]string{"bench", "--dir", filepath.Join(empty, "b"), "--ranks", "0"}, 2, "ckptbench: ranks=0: must be at least 1"},
		{[]string{"bench", "--dir", filepath.Join(empty, "b"), "--fill", "ones"}, 2, `ckptbench: fill="ones": must be zero or random`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, errOut := runCkpt(t, tc.args...)
			require.Equal(t, tc.code, code, errOut)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
		})
	}
}
