package ckptbench

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/checkpoint"
)

// A run saves, loads and saves again asynchronously through the real
// checkpoint package, and leaves verifiable checkpoints behind.
func TestRun(t *testing.T) {
	for _, fill := range []string{"zero", "random"} {
		t.Run(fill, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ck")
			res, err := Run(context.Background(), Config{Dir: dir, Bytes: 64 << 10, Ranks: 2, Fill: fill})
			require.NoError(t, err)
			require.Equal(t, 2, res.Ranks)
			require.Equal(t, int64(64<<10), res.Bytes)
			for _, s := range []float64{res.SaveSeconds, res.LoadSeconds, res.AsyncSeconds, res.AsyncStallSeconds} {
				require.Positive(t, s)
			}
			for _, step := range []int64{1, 2, 3} {
				ck, err := checkpoint.Open(filepath.Join(dir, checkpoint.StepName(step)))
				require.NoError(t, err)
				require.NoError(t, ck.Verify(context.Background()), "step %d", step)
				require.NoError(t, ck.Close())
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Dir: "d", Bytes: 32, Ranks: 1, Fill: "zero"}
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{"ok", func(*Config) {}, ""},
		{"no dir", func(c *Config) { c.Dir = "" }, "ckptbench: no directory"},
		{"no ranks", func(c *Config) { c.Ranks = 0 }, "ckptbench: ranks=0: must be at least 1"},
		{"too small", func(c *Config) { c.Bytes = 31 }, "ckptbench: bytes=31: must be at least 32"},
		{"bad fill", func(c *Config) { c.Fill = "ones" }, `ckptbench: fill="ones": must be zero or random`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.wantErr)
		})
	}
}
