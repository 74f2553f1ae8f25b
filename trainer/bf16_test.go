package trainer

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/kernels"
)

// TestBF16TrainsLikeFP32 trains examples/train.toml's model on one
// process for its 300 steps, in fp32 and with bf16 GEMMs, for seeds 1 to
// 4, on a CPU with AVX512_BF16 (the portable kernel gives the same bits,
// tested in package kernels, but would take too long here), and requires
// the mean over the seeds of the mean loss of the last ten steps with
// bf16 at most 1 % above fp32's. One-sided on purpose: the issue asks
// that bf16 lose nothing. Averaged over seeds because one trajectory is
// chaotic: any change of rounding anywhere (a kernel's summation order)
// moves a single seed's loss at step 300 by up to 2 % either way, as the
// run leaves the early loss plateau a little sooner or later. Measured
// over seeds 1-6: per seed -0.5 % to +1.9 %, mean +0.5 %; seeds 1-4 +0.3 %.
// Every seed is logged.
func TestBF16TrainsLikeFP32(t *testing.T) {
	if !kernels.BF16InHardware() {
		t.Skip("this CPU has no AVX512_BF16: 1200 steps on the portable bf16 kernel take too long for a test")
	}
	const steps = 300
	lastTen := func(t *testing.T, seed int, precision string) float64 {
		cfg, err := config.Load(filepath.Join("..", "examples", "train.toml"), []string{
			fmt.Sprintf("train.steps=%d", steps), fmt.Sprintf("train.seed=%d", seed), "train.metrics=''",
			`train.precision="` + precision + `"`})
		require.NoError(t, err)
		run := runWorld(t, cfg, 1, 1, runOpts{})[0]
		require.NoError(t, run.err)
		require.Len(t, run.losses, steps)
		sum := 0.0
		for _, l := range run.losses[steps-10:] {
			sum += l
		}
		return sum / 10
	}
	seeds := []int{1, 2, 3, 4}
	precisions := []string{config.PrecisionFP32, config.PrecisionBF16}
	// Each run is one process of one thread: they run side by side, as
	// many at once as -test.parallel allows (GOMAXPROCS).
	loss := make([][2]float64, len(seeds))
	t.Run("runs", func(t *testing.T) {
		for i, seed := range seeds {
			for j, precision := range precisions {
				t.Run(fmt.Sprintf("seed=%d/%s", seed, precision), func(t *testing.T) {
					t.Parallel()
					loss[i][j] = lastTen(t, seed, precision)
				})
			}
		}
	})
	if t.Failed() {
		return
	}
	var fp32, bf16 float64
	for i, seed := range seeds {
		f, b := loss[i][0], loss[i][1]
		t.Logf("seed %d: mean loss of steps %d-%d: fp32 %.4f, bf16 %.4f (%+.2f %%)",
			seed, steps-9, steps, f, b, 100*(b/f-1))
		fp32 += f / float64(len(seeds))
		bf16 += b / float64(len(seeds))
	}
	t.Logf("mean over seeds %v: fp32 %.4f, bf16 %.4f (%+.2f %%)", seeds, fp32, bf16, 100*(bf16/fp32-1))
	require.LessOrEqual(t, bf16, 1.01*fp32, "bf16 more than 1 %% above fp32 over seeds %v", seeds)
}
