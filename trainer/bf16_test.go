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
// process for its 300 steps, in fp32 and with bf16
// GEMMs, for seeds 1 and 2, on a CPU with AVX512_BF16 (the portable
// kernel gives the same bits, tested in package kernels, but would take
// a quarter of an hour here), and requires the mean loss of the last ten
// steps with bf16 at most 1 % above fp32's. One-sided on purpose: the
// issue asks that bf16 lose nothing, and the rounding noise of bf16 can
// also let a run leave the early loss plateau sooner. With seed 1 it does
// (fp32 2.8315, bf16 2.6480: 6.5 % lower, a different trajectory, not a
// worse one); with seed 2 they end 0.03 % apart (2.8326, 2.8318). Both
// are logged.
func TestBF16TrainsLikeFP32(t *testing.T) {
	if !kernels.BF16InHardware() {
		t.Skip("this CPU has no AVX512_BF16: 1200 steps on the portable bf16 kernel take too long for a test")
	}
	const steps = 300
	lastTen := func(seed int, precision string) float64 {
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
	for _, seed := range []int{1, 2} {
		fp32, bf16 := lastTen(seed, config.PrecisionFP32), lastTen(seed, config.PrecisionBF16)
		t.Logf("seed %d: mean loss of steps %d-%d: fp32 %.4f, bf16 %.4f (%+.2f %%)",
			seed, steps-9, steps, fp32, bf16, 100*(bf16/fp32-1))
		require.LessOrEqual(t, bf16, 1.01*fp32, "seed %d: bf16 more than 1 %% above fp32", seed)
	}
}
