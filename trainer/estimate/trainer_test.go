package estimate

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/data"
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
		checkpointing                    bool
	}{
		{2, 64, 4, 64, 8, false},
		{4, 128, 4, 128, 4, false},
		{6, 192, 6, 256, 2, false},
		{2, 64, 4, 512, 1, false},
		{6, 192, 6, 256, 2, true},
		{8, 512, 8, 64, 2, true},
	}
	for _, tc := range cases {
		c := config.Default()
		c.Model = config.Model{Layers: tc.layers, DModel: tc.d, Heads: tc.heads, Context: tc.context}
		c.Train.MicroBatch = tc.micro
		c.Train.ActivationCheckpointing = tc.checkpointing
		cfg := model.Config{Layers: tc.layers, DModel: tc.d, Heads: tc.heads, Context: tc.context, Vocab: config.Vocab}
		require.Equal(t, int64(model.NewLayout(cfg).Size), c.Model.Params(), "parameter count of %+v", tc)

		m, l, _ := FromConfig(c, 1, 1)
		es, err := Compute(m, l, FP32())
		require.NoError(t, err)
		before := heapAlloc()
		mod, err := model.New(cfg, tc.micro, kernels.New(1), model.WithActivationCheckpointing(tc.checkpointing))
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

// TestTrainerAsItAllocates checks Trainer against a real one-rank
// trainer after two steps (the rollback copy exists from the first
// update on): the heap it holds, measured, is what Trainer counts less
// its runtime column, up to the kernels' packing scratch (about 2 % here), which
// it leaves out.
func TestTrainerAsItAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's allocations blur the heap measurement")
	}
	c := config.Default()
	c.Model = config.Model{Layers: 4, DModel: 128, Heads: 4, Context: 128}
	c.Train.MicroBatch, c.Train.GlobalBatch, c.Train.Steps = 4, 4, 2
	c.Optim.Warmup = 1
	c.Checkpoint.Dir = ""
	c.Train.Metrics = "" // the default, metrics.jsonl, would be written into this package's directory
	ds := data.New([]byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", 200)))
	want, err := Trainer(c, 1, 1)
	require.NoError(t, err)

	before := heapAlloc()
	tr, err := trainer.New(context.Background(), trainer.Config{Train: c, Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1}, Threads: 1, Dataset: ds})
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	measured := float64(heapAlloc() - before)
	runtime.KeepAlive(tr)
	heap := want.Total - want.Runtime // the runtime is not on the heap; one rank has no comm buffers
	require.Zero(t, want.Comm)
	t.Logf("the trainer holds %s; Trainer counts %s on the heap (%.3fx): params %s, grads %s, optimizer %s, copies %s, activations %s",
		FormatBytes(int64(measured)), FormatBytes(heap), measured/float64(heap), FormatBytes(want.Params),
		FormatBytes(want.Grads), FormatBytes(want.Optimizer), FormatBytes(want.Copies), FormatBytes(want.Activations))
	require.InDelta(t, 1, measured/float64(heap), 0.05)
}
