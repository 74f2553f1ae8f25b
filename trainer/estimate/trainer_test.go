package estimate

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/model"
)

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestAgainstTheTrainer checks FromConfig against the embedded trainer
// itself: its exact parameter count, and the heap its activations and
// backward buffers take, measured.
func TestAgainstTheTrainer(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's allocations blur the heap measurement")
	}
	cases := []struct {
		layers, d, heads, context, micro int
	}{
		{2, 64, 4, 64, 8},
		{4, 128, 4, 128, 4},
		{6, 192, 6, 256, 2},
		{2, 64, 4, 512, 1},
	}
	for _, tc := range cases {
		c := config.Default()
		c.Model = config.Model{Layers: tc.layers, DModel: tc.d, Heads: tc.heads, Context: tc.context}
		c.Train.MicroBatch = tc.micro
		cfg := model.Config{Layers: tc.layers, DModel: tc.d, Heads: tc.heads, Context: tc.context, Vocab: config.Vocab}
		require.Equal(t, int64(model.NewLayout(cfg).Size), c.Model.Params(), "parameter count of %+v", tc)

		m, l, _ := FromConfig(c, 1, 1)
		es, err := Compute(m, l, FP32())
		require.NoError(t, err)
		before := heapAlloc()
		mod, err := model.New(cfg, tc.micro, kernels.New(1))
		require.NoError(t, err)
		measured := float64(heapAlloc() - before)
		runtime.KeepAlive(mod)
		ratio := measured / float64(es[0].Activations)
		formula := Activations(m, 1, FP32().ActivationScale)
		t.Logf("%+v: the trainer holds %s; counted %s (%.3fx); the fp32 formula says %s (%.2fx)", tc,
			FormatBytes(int64(measured)), FormatBytes(es[0].Activations), ratio, FormatBytes(int64(formula)), measured/formula)
		require.InDelta(t, 1, ratio, 0.02, "measured %d bytes, counted %d", int64(measured), es[0].Activations)
	}
}
