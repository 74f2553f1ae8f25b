package chart

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/metrics"
)

func TestFormatOf(t *testing.T) {
	cases := []struct {
		path string
		want Format
		err  string
	}{
		{"loss.png", PNG, ""},
		{"out/LOSS.PNG", PNG, ""},
		{"loss.svg", SVG, ""},
		{"loss.jpg", "", `chart: loss.jpg: unknown image format ".jpg": name it .png or .svg`},
		{"loss", "", "chart: loss has no extension: name it .png or .svg, the format follows"},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			got, err := FormatOf(tc.path)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestChanges(t *testing.T) {
	rec := func(step, world int, elapsed float64) metrics.Record {
		return metrics.Record{Step: step, WorldSize: world, ElapsedS: elapsed}
	}
	cases := []struct {
		name  string
		recs  []metrics.Record
		want  []Change
		label []string
	}{
		{"none", []metrics.Record{rec(1, 2, 1), rec(2, 2, 2)}, nil, nil},
		{"restart at another world size", []metrics.Record{rec(1, 2, 1), rec(2, 2, 2), rec(3, 1, 0.5)},
			[]Change{{Step: 3, From: 2, To: 1, Restart: true}}, []string{"restart, world 2→1"}},
		{"restart at the same world size", []metrics.Record{rec(1, 2, 1), rec(2, 2, 0.5)},
			[]Change{{Step: 2, From: 2, To: 2, Restart: true}}, []string{"restart"}},
		{"in-place recovery", []metrics.Record{rec(1, 4, 1), rec(2, 3, 2), rec(3, 4, 3)},
			[]Change{{Step: 2, From: 4, To: 3}, {Step: 3, From: 3, To: 4}}, []string{"world 4→3", "world 3→4"}},
		{"no elapsed_s", []metrics.Record{rec(1, 2, math.NaN()), rec(2, 2, math.NaN())}, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Changes(tc.recs)
			require.Equal(t, tc.want, got)
			var labels []string
			for _, c := range got {
				labels = append(labels, c.Label())
			}
			require.Equal(t, tc.label, labels)
		})
	}
}

// trainerFile writes a metrics file with the trainer's metrics writer: a
// run of 120 steps on 2 workers, resumed at step 81 on 1 (a new process),
// with a held-out loss every 40 steps and a NaN loss at step 50.
func trainerFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	write := func(from, to, world, round int) {
		w, err := metrics.Open(path, 0)
		require.NoError(t, err)
		for s := from; s <= to; s++ {
			r := metrics.Record{Step: s, Loss: 5.5*math.Exp(-float64(s)/60) + 2, LR: 1e-3,
				TokensPerS: 30000 * float64(world), WorldSize: world, Round: round, ElapsedS: float64(s - from)}
			if s%40 == 0 {
				r.ValLoss = r.Loss + 0.1
			}
			if s == 50 {
				r.Loss = math.NaN()
			}
			require.NoError(t, w.Write(r))
		}
		require.NoError(t, w.Close())
	}
	write(1, 90, 2, 0) // steps 81-90 are lost with the worker
	write(81, 120, 1, 1)
	return path
}

func TestWriteFilePNGAndSVG(t *testing.T) {
	all, err := metrics.ReadFile(trainerFile(t))
	require.NoError(t, err)
	require.Len(t, all, 130, "the records of both worlds")
	recs := metrics.History(all)
	require.Len(t, recs, 120)
	require.Equal(t, []Change{{Step: 81, From: 2, To: 1, Restart: true}}, Changes(recs))
	dir := t.TempDir()

	pngPath := filepath.Join(dir, "loss.png")
	require.NoError(t, WriteFile(pngPath, recs, "a run"))
	b, err := os.ReadFile(pngPath)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, 800, img.Bounds().Dx())
	require.Equal(t, 600, img.Bounds().Dy())

	svgPath := filepath.Join(dir, "loss.svg")
	require.NoError(t, WriteFile(svgPath, recs, "a run"))
	b, err = os.ReadFile(svgPath)
	require.NoError(t, err)
	var svg struct {
		XMLName xml.Name
		Width   string `xml:"width,attr"`
		Height  string `xml:"height,attr"`
	}
	require.NoError(t, xml.Unmarshal(b, &svg))
	require.Equal(t, "svg", svg.XMLName.Local)
	require.Equal(t, []string{"576pt", "432pt"}, []string{svg.Width, svg.Height}, "8 x 6 inches")
	require.Contains(t, string(b), "restart, world 2→1")
	require.Contains(t, string(b), "held-out loss")

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "no temporary file is left")
	fi, err := os.Stat(pngPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
}

func TestWriteFileEdges(t *testing.T) {
	dir := t.TempDir()
	one := []metrics.Record{{Step: 7, Loss: 3, TokensPerS: 100, WorldSize: 1}}
	require.NoError(t, WriteFile(filepath.Join(dir, "one.png"), one, "one step"))
	nan := []metrics.Record{{Step: 1, Loss: math.NaN(), TokensPerS: math.NaN()}, {Step: 2, Loss: math.NaN()}}
	require.NoError(t, WriteFile(filepath.Join(dir, "nan.svg"), nan, "no figures"))
	require.EqualError(t, WriteFile(filepath.Join(dir, "none.png"), nil, "x"), "chart: render: no records to draw")
	require.EqualError(t, WriteFile(filepath.Join(dir, "x.gif"), one, "x"), `chart: `+filepath.Join(dir, "x.gif")+`: unknown image format ".gif": name it .png or .svg`)
	require.ErrorContains(t, WriteFile(filepath.Join(dir, "no", "such", "dir.png"), one, "x"), "chart: write")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "only the two charts drawn: %v", entries)
}

func TestSI(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 250: "250", 1500: "1.5k", 60000: "60k", 2_500_000: "2.5M", 0.25: "0.25"} {
		require.Equal(t, want, si(v), "%v", v)
	}
}
