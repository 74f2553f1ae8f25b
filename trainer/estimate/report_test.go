package estimate

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
)

// A train.toml's report carries the trainer's own row for the strategy it
// runs and fp32 rows for the others; a model's, the mixed-precision rows;
// an optimizer override reaches every row it computes.
func TestReport(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "train.toml")
	cfg, err := config.Load(path, nil)
	require.NoError(t, err)
	r, err := ForConfig(path, cfg, 2, 2, nil)
	require.NoError(t, err)
	exact, err := Trainer(cfg, 2, 2)
	require.NoError(t, err)
	require.NotEmpty(t, r.Selected)
	require.Equal(t, FP32(), r.Precision)
	require.Contains(t, r.Estimates, exact, "the trainer's row replaces the strategy's")
	require.True(t, strings.HasPrefix(r.Header[0], path+": "), r.Header[0])

	var text bytes.Buffer
	require.NoError(t, r.WriteText(&text))
	require.Contains(t, text.String(), "world: 2 nodes x 2 processes = 4 GPUs")
	require.Contains(t, text.String(), "* the strategy the train.toml runs")
	var js bytes.Buffer
	require.NoError(t, r.WriteJSON(&js))
	require.Len(t, strings.Split(strings.TrimSpace(js.String()), "\n"), len(r.Estimates))
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.Split(js.String(), "\n")[0]), &first))

	m := Model{Params: 7e9, Layers: 32, Hidden: 4096, Heads: 32, Seq: 4096, Batch: 1}
	l := Layout{Nodes: 1, ProcPerNode: 8, TP: 1}
	four := 4.0
	for _, tt := range []struct {
		name      string
		optimizer *float64
		want      float64
	}{{"default", nil, MixedPrecision().Optimizer}, {"override", &four, 4}} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ForModel(m, l, tt.optimizer)
			require.NoError(t, err)
			require.Equal(t, tt.want, r.Precision.Optimizer)
			p := MixedPrecision()
			p.Optimizer = tt.want
			want, err := Compute(m, l, p)
			require.NoError(t, err)
			require.Equal(t, want, r.Estimates)
			require.Empty(t, r.Selected)
			var text bytes.Buffer
			require.NoError(t, r.WriteText(&text))
			require.Contains(t, text.String(), "bytes per parameter: 2 weights, 2 gradients, ")
		})
	}
	_, err = ForModel(Model{}, l, nil)
	require.Error(t, err, "Compute's validation")
}
