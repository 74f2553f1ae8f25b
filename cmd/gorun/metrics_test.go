package main

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/metrics"
)

// `gorun metrics plot FILE -o OUT` writes the chart in OUT's format; bad
// input exits 2 with one line that names the file and what to do.
func TestMetricsPlot(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "metrics.jsonl")
	w, err := metrics.Open(good, 0)
	require.NoError(t, err)
	for s := 1; s <= 20; s++ {
		require.NoError(t, w.Write(metrics.Record{Step: s, Loss: 5 - float64(s)/10, TokensPerS: 1000, WorldSize: 2, ElapsedS: float64(s)}))
	}
	require.NoError(t, w.Close())
	empty := filepath.Join(dir, "empty.jsonl")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"step\":1}\n{\"step\":2\n{\"step\":3}\n"), 0o644))

	out := filepath.Join(dir, "loss.png")
	code, stdout, stderr := run(t, nil, "metrics", "plot", good, "-o", out)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "wrote "+out+": 20 records, steps 1-20, 0 restarts or world-size changes\n", stdout)
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	require.Equal(t, [2]int{800, 600}, [2]int{cfg.Width, cfg.Height})

	// A world that went back to step 15 appends the steps it redid; the
	// chart is of the job's final line of steps.
	rolled := filepath.Join(t.TempDir(), "rolled.jsonl")
	w, err = metrics.Open(rolled, 0)
	require.NoError(t, err)
	for round, steps := range [][]int{seq(1, 20), seq(15, 25)} {
		for _, s := range steps {
			require.NoError(t, w.Write(metrics.Record{Step: s, Loss: 1, TokensPerS: 1000, WorldSize: 2, Round: round, ElapsedS: float64(s)}))
		}
	}
	require.NoError(t, w.Close())
	rolledOut := filepath.Join(filepath.Dir(rolled), "loss.png")
	code, stdout, stderr = run(t, nil, "metrics", "plot", rolled, "-o", rolledOut)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "wrote "+rolledOut+": 25 records (6 more in the file: steps a later world redid), steps 1-25, 0 restarts or world-size changes\n", stdout)

	code, _, stderr = run(t, nil, "metrics", "plot", "--output="+filepath.Join(dir, "loss.svg"), good)
	require.Equal(t, 0, code, stderr)
	require.FileExists(t, filepath.Join(dir, "loss.svg"))

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing file", []string{filepath.Join(dir, "nope.jsonl")}, "metrics: read " + filepath.Join(dir, "nope.jsonl") + ": no such file"},
		{"empty file", []string{empty}, "metrics: read " + empty + ": no records: the file is empty"},
		{"malformed line", []string{bad}, "metrics: read " + bad + ":2: not a JSON object"},
		{"unknown extension", []string{good, "-o", filepath.Join(dir, "loss.gif")}, `unknown image format ".gif": name it .png or .svg`},
		{"no file", nil, "metrics plot: give one metrics file"},
		{"unknown flag", []string{good, "--bogus"}, "unknown flag --bogus (gorun metrics plot --help lists the flags)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, nil, append([]string{"metrics", "plot"}, tc.args...)...)
			require.Equal(t, exitUsage, code)
			require.Contains(t, stderr, tc.want)
		})
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 5, "the three inputs and the two charts: %v", entries)
}

// seq is from, from+1, ..., to.
func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}
