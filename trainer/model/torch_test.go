package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/kernels"
)

// TestMatchesPyTorch runs the same model in PyTorch (testdata/torch_gpt.py, autograd in
// float64, tensors taken from the flat buffer by Layout name and shape) and requires the same
// loss and gradients: it checks that the layout's names, shapes and the math mean what a
// nanoGPT-style PyTorch model means. Skipped with -short; skipped without torch, or failed when
// CI=true.
func TestMatchesPyTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts python3 with torch")
	}
	torch := testutil.Torch{Python: testutil.DebianPython}
	torchPython := torch.Require(t)
	cfg := Config{Layers: 2, DModel: 16, Heads: 4, Context: 8, Vocab: 256}
	const batch = 3
	m, err := New(cfg, batch, kernels.New(2))
	require.NoError(t, err)
	l := m.Layout()
	p := noisyParams(cfg, 21, 0.2)
	tok := randomTokens(m.TokensLen(), cfg.Vocab, 22)
	loss := m.Forward(p, tok)
	grads := make([]float32, l.Size)
	m.Backward(p, grads, 1)

	dir := t.TempDir()
	js, err := json.Marshal(map[string]any{"layers": cfg.Layers, "d_model": cfg.DModel,
		"heads": cfg.Heads, "context": cfg.Context, "vocab": cfg.Vocab, "batch": batch,
		"tensors": l.Tensors})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "params.bin"), floatsLE(p), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.bin"), tok, 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, torchPython, "testdata/torch_gpt.py", dir).CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) || strings.Contains(string(out), "No module named") {
		testutil.SkipOrFail(t, "no python3 with torch and numpy at %s: %v: %s", torchPython, err, out)
	}
	require.NoError(t, err, string(out))

	txt, err := os.ReadFile(filepath.Join(dir, "loss.txt"))
	require.NoError(t, err)
	want, err := strconv.ParseFloat(strings.TrimSpace(string(txt)), 64)
	require.NoError(t, err)
	require.InEpsilon(t, want, float64(loss), 1e-6)

	raw, err := os.ReadFile(filepath.Join(dir, "grads.bin"))
	require.NoError(t, err)
	require.Len(t, raw, 4*l.Size)
	for _, ti := range l.Tensors {
		var diff2, ref2 float64
		for i := ti.Offset; i < ti.Offset+ti.Len(); i++ {
			r := float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
			d := float64(grads[i]) - r
			diff2 += d * d
			ref2 += r * r
		}
		rel := math.Sqrt(diff2 / max(ref2, 1e-30))
		require.Less(t, rel, 1e-5, ti.Name)
	}
}

func floatsLE(p []float32) []byte {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
