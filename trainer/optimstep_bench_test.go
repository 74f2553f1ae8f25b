package trainer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/optim"
)

// benchElements is the parameter count of the bench model
// (bench/trainer.sh: LAYERS=4 DMODEL=128 CONTEXT=128).
const benchElements = 842496

// BenchmarkOptimizerPhase times each piece of a step's optimizer phase,
// and the buffer work around it, on the bench model's size in one
// process, on one and two threads.
func BenchmarkOptimizerPhase(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	n := benchElements
	unit, owned, params := make([]float32, n), make([]float32, n), make([]float32, n)
	sum, st := make([]float64, n), optim.NewState(n)
	for i := range n {
		unit[i], params[i] = r.Float32()-0.5, r.Float32()-0.5
	}
	decay := model.NewLayout(model.Config{Layers: 4, DModel: 128, Heads: 4, Context: 128, Vocab: config.Vocab}).DecaySpans(0, n)
	cfg := optim.Config{LR: 3e-3, MinLR: 3e-4, Warmup: 20, Steps: 200, Beta1: 0.9, Beta2: 0.95,
		Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}
	for _, threads := range []int{1, 2} {
		e := kernels.New(threads)
		_, rb := sumAndRollback(n, false)
		keep := rb.buffers(n)
		for _, piece := range []struct {
			name string
			run  func()
		}{
			{"zeroSum", func() { zero(e, sum) }},
			{"zeroUnit", func() { zero(e, unit) }},
			{"roundMean", func() { roundMean(sum, 1) }},
			{"roundMean3", func() { roundMean(sum, 3) }},
			{"sumSquares", func() { optim.SumSquares(e, owned) }},
			{"update", func() {
				st.Step = 0
				if _, err := optim.Update(e, cfg, &st, params, unit, decay, 0.9, kernels.Kept{}); err != nil {
					b.Fatal(err)
				}
			}},
			{"updateKeeping", func() {
				st.Step = 0
				if _, err := optim.Update(e, cfg, &st, params, unit, decay, 0.9, keep); err != nil {
					b.Fatal(err)
				}
			}},
		} {
			b.Run(fmt.Sprintf("%s/threads=%d", piece.name, threads), func(b *testing.B) {
				for b.Loop() {
					piece.run()
				}
			})
		}
	}
}
