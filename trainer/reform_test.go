package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/internal/worldtest"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/recovery"
)

// errBoundary is what AfterStep returns to stop every rank at a step
// boundary (a new round between steps).
var errBoundary = errors.New("new round at a step boundary")

// errInjected is what a fault hook returns.
var errInjected = errors.New("injected fault")

// process is one worker of a two-world scenario: a rank of the first
// world (old >= 0) that may go on as a rank of the second (next >= 0),
// or a fresh worker that joins the second (old < 0).
type process struct{ old, next int }

// scenario is a run in a first world that breaks, then goes on in a
// second one made of the survivors and any fresh workers.
type scenario struct {
	cfg                   config.Config
	first, firstPerNode   int
	second, secondPerNode int
	procs                 []process
	// afterStep is every first-world rank's AfterStep on top of the
	// bookkeeping; cancel vanishes that rank (its Run closes its world).
	afterStep func(old, step int, cancel context.CancelFunc) error
	// setup sets a first-world rank's hooks right after New.
	setup func(old int, tr *Trainer)
	// onStep, when set, sees every step a first-world rank completes,
	// before afterStep.
	onStep func(old int, tr *Trainer)
	// hold, when set, is what a fresh worker holds before its Exchange
	// (Trainer.HoldSaved): the state its rank saved in the first world.
	hold func(next int) []recovery.Slice
	// metrics is the metrics pattern, "" for none.
	metrics string
	// messageElems, when positive, is every rank's bound on the elements
	// of one transfer message.
	messageElems int
}

// outcome is what one process left behind.
type outcome struct {
	firstErr error          // from the first Run (nil for fresh workers)
	rec      Recovery       // from Reform or Exchange
	err      error          // from New, Reform, Exchange or the second Run
	state    recovery.State // at the end, in the second world
	steps    []int          // the steps of the records AfterStep saw, both worlds
}

// play runs sc: every process in its own goroutine over loopback.
func play(t *testing.T, sc scenario) []outcome {
	t.Helper()
	worlds := worldtest.Rounds(t, "reform-test", worldtest.Shape{Size: sc.first, PerNode: sc.firstPerNode},
		worldtest.Shape{Size: sc.second, PerNode: sc.secondPerNode})
	ds := datasetOf(t, sc.cfg)
	out := make([]outcome, len(sc.procs))
	var firstDone sync.WaitGroup // every first-world rank's first Run returned
	for _, p := range sc.procs {
		if p.old >= 0 {
			firstDone.Add(1)
		}
	}
	testutil.OnRanks(len(sc.procs), func(i int) error {
		p, o := sc.procs[i], &out[i]
		cfg := Config{Train: sc.cfg, Threads: 1, Dataset: ds, CommTimeout: 30 * time.Second, Metrics: sc.metrics}
		var w2 distenv.Worker
		if p.next >= 0 {
			w2 = worlds[1].Worker(p.next)
		}
		if p.old < 0 {
			firstDone.Wait()
			cfg.Worker = w2
			cfg.AfterStep = func(_ *Trainer, rec metrics.Record) error { o.steps = append(o.steps, rec.Step); return nil }
			tr, err := New(context.Background(), cfg)
			if err != nil {
				o.err = err
				return nil
			}
			defer tr.Close()
			tr.hooks.messageElems = sc.messageElems
			if sc.hold != nil {
				if o.err = tr.HoldSaved(sc.hold(p.next)); o.err != nil {
					return nil
				}
			}
			if o.rec, o.err = tr.Exchange(context.Background(), nil); o.err != nil {
				return nil
			}
			_, o.err = tr.Run(context.Background())
			o.state = copyState(tr.State())
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg.Worker = worlds[0].Worker(p.old)
		cfg.AfterStep = func(tr *Trainer, rec metrics.Record) error {
			o.steps = append(o.steps, rec.Step)
			if sc.onStep != nil && rec.WorldSize == sc.first {
				sc.onStep(p.old, tr)
			}
			if sc.afterStep != nil && rec.WorldSize == sc.first {
				return sc.afterStep(p.old, rec.Step, cancel)
			}
			return nil
		}
		tr, err := New(ctx, cfg)
		if err != nil {
			o.firstErr = err
			firstDone.Done()
			return nil
		}
		defer tr.Close()
		tr.hooks.messageElems = sc.messageElems
		if sc.setup != nil {
			sc.setup(p.old, tr)
		}
		_, o.firstErr = tr.Run(ctx)
		firstDone.Done()
		if p.next < 0 {
			return nil
		}
		tr.hooks.beforeUpdate, tr.hooks.afterUpdate = nil, nil
		if o.rec, o.err = tr.Reform(context.Background(), w2, nil); o.err != nil {
			return nil
		}
		_, o.err = tr.Run(context.Background())
		o.state = copyState(tr.State())
		return nil
	})
	return out
}

// assemble puts the slices of states together into whole buffers of n
// elements (n: the model's size; padding is dropped).
func assemble(t *testing.T, states []recovery.State, n int) (params, m, v []float32) {
	t.Helper()
	params, m, v = make([]float32, n), make([]float32, n), make([]float32, n)
	covered := make([]bool, n)
	for _, s := range states {
		for i := s.Lo; i < min(s.Hi, n); i++ {
			params[i], m[i], v[i] = s.Params[i-s.Lo], s.M[i-s.Lo], s.V[i-s.Lo]
			covered[i] = true
		}
	}
	for i, c := range covered {
		require.True(t, c, "element %d held by no rank", i)
	}
	return params, m, v
}

// requireAllClose checks |got-want| <= atol + rtol |want| element-wise
// for params, m and v, as numpy.allclose with rtol 1e-5 and atol 1e-6,
// and returns the largest absolute difference. It looks at every element
// before failing, so the log says how far apart the two runs are and how
// many elements are out of tolerance, not only the first one.
func requireAllClose(t *testing.T, got, want []recovery.State, n int) float64 {
	t.Helper()
	const rtol, atol = 1e-5, 1e-6
	gp, gm, gv := assemble(t, got, n)
	wp, wm, wv := assemble(t, want, n)
	var worst float64
	var outside int
	var first string
	for _, tensor := range []struct {
		name      string
		got, want []float32
	}{{"params", gp, wp}, {"m", gm, wm}, {"v", gv, wv}} {
		for i := range tensor.got {
			d := math.Abs(float64(tensor.got[i]) - float64(tensor.want[i]))
			worst = max(worst, d)
			if d > atol+rtol*math.Abs(float64(tensor.want[i])) {
				if outside == 0 {
					first = fmt.Sprintf("%s[%d]: %g vs %g", tensor.name, i, tensor.got[i], tensor.want[i])
				}
				outside++
			}
		}
	}
	t.Logf("max |diff| to the reference run over params, m, v: %.3g", worst)
	require.Zero(t, outside, "elements of params, m, v not allclose to the reference run; the first: %s", first)
	return worst
}

// faultFree is the final state of every rank of an undisturbed run.
func faultFree(t *testing.T, cfg config.Config, size, perNode int) []recovery.State {
	t.Helper()
	runs := runWorld(t, cfg, size, perNode, runOpts{})
	states := make([]recovery.State, size)
	for r, run := range runs {
		require.NoError(t, run.err, "fault-free rank %d", r)
		states[r] = run.state
	}
	return states
}

// reformConfig is tiny with 20 steps and a global batch that splits over
// 1, 2, 3, 4 and 6 ranks, at the default AdamW eps (1e-8): the model
// computes the attention's key-bias gradient as the exact 0 it is, so no
// rounding noise gets amplified into world-size-dependent updates.
func reformConfig(t *testing.T, mode string) config.Config {
	return tinyConfig(t, "parallel.mode="+mode, "train.steps=20", "train.global_batch=24")
}

func modelSize(t *testing.T, cfg config.Config) int {
	tr, err := New(context.Background(), Config{Train: cfg, Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1},
		Threads: 1, Dataset: text()})
	require.NoError(t, err)
	defer tr.Close()
	return tr.Layout().Size
}

func statesOf(out []outcome) []recovery.State {
	var s []recovery.State
	for _, o := range out {
		if o.state.Params != nil {
			s = append(s, o.state)
		}
	}
	return s
}

func requirePeerError(t *testing.T, err error, who string) {
	t.Helper()
	var pe *comm.PeerError
	require.ErrorAs(t, err, &pe, "%s", who)
}

// exampleConfig is examples/train.toml's model and optimizer (lr 1e-2,
// eps 1e-8) for 30 steps of a global batch of 48 in micro batches of 4,
// which splits over 1, 2, 3, 4, 6 and 12 ranks.
func exampleConfig(t *testing.T, mode string) config.Config {
	t.Helper()
	cfg, err := config.Load(filepath.Join("..", "examples", "train.toml"), []string{"parallel.mode=" + mode,
		"train.steps=30", "train.global_batch=48", "train.micro_batch=4", "train.metrics=''"})
	require.NoError(t, err)
	return cfg
}

// TestWorldSizeDoesNotMatter: fault-free runs with the same global batch
// on 1, 2, 4 and 6 ranks, HSDP (2 ranks a node) and FSDP, end allclose to
// each other, params and AdamW's m and v, at the default eps: the world
// size changes only where each micro batch's gradient is computed, and the
// step's gradient is their sum in float64 rounded once (see Run). This is
// what lets a run that changes world size mid-way end allclose to a
// fault-free one. The tiny model runs 20 steps, examples/train.toml's 30
// at lr 1e-2, where AdamW turns any rounding noise in tiny gradients into
// steps of the learning rate's size.
func TestWorldSizeDoesNotMatter(t *testing.T) {
	models := []struct {
		name   string
		config func(t *testing.T, mode string) config.Config
	}{{"tiny", reformConfig}, {"example", exampleConfig}}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			n := modelSize(t, m.config(t, config.ModeHSDP))
			want := faultFree(t, m.config(t, config.ModeHSDP), 1, 1)
			for _, tc := range []struct {
				mode          string
				size, perNode int
			}{
				{config.ModeHSDP, 2, 2}, {config.ModeHSDP, 4, 2}, {config.ModeHSDP, 6, 2},
				{config.ModeFSDP, 2, 2}, {config.ModeFSDP, 4, 4}, {config.ModeFSDP, 6, 6},
			} {
				t.Run(fmt.Sprintf("%s %d ranks", tc.mode, tc.size), func(t *testing.T) {
					got := faultFree(t, m.config(t, tc.mode), tc.size, tc.perNode)
					requireAllClose(t, got, want, n)
					t.Logf("bit-identical to one rank: %v", sameBits(t, got, want, n))
				})
			}
		})
	}
}

// sameBits says whether the params, m and v of got and want are the same
// bits, element for element.
func sameBits(t *testing.T, got, want []recovery.State, n int) bool {
	t.Helper()
	gp, gm, gv := assemble(t, got, n)
	wp, wm, wv := assemble(t, want, n)
	return slices.Equal(gp, wp) && slices.Equal(gm, wm) && slices.Equal(gv, wv)
}

// TestReformAfterReplicaLoss: HSDP 3 replicas x 2 shards; at step 10 (12
// for examples/train.toml's model) the two ranks of replica 2 vanish; the
// survivors' Run fails naming a peer, they Reform into a 2 x 2 world and
// finish. Nothing is fetched (every survivor keeps its slice), every step
// is recorded once, and the end is allclose to the fault-free 3 x 2 run.
func TestReformAfterReplicaLoss(t *testing.T) {
	tests := []struct {
		name   string
		config func(t *testing.T, mode string) config.Config
		lostAt int
	}{{"tiny", reformConfig, 10}, {"example", exampleConfig, 12}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.config(t, config.ModeHSDP)
			dir := t.TempDir()
			sc := scenario{cfg: cfg, first: 6, firstPerNode: 2, second: 4, secondPerNode: 2,
				procs:   []process{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, -1}, {5, -1}},
				metrics: filepath.Join(dir, "m{rank}.jsonl"),
				afterStep: func(old, step int, cancel context.CancelFunc) error {
					if old >= 4 && step == tc.lostAt {
						cancel()
					}
					return nil
				}}
			out := play(t, sc)
			for i, o := range out[:4] {
				requirePeerError(t, o.firstErr, fmt.Sprintf("survivor %d", i))
				require.NoError(t, o.err, "survivor %d", i)
				require.Equal(t, Recovery{Source: recovery.Peers, Step: int64(tc.lostAt)}, withoutTook(o.rec), "survivor %d", i)
				recs := readRecords(t, filepath.Join(dir, fmt.Sprintf("m%d.jsonl", i)))
				require.Len(t, recs, cfg.Train.Steps, "rank %d: every step once", i)
				for k, rec := range recs {
					require.EqualValues(t, k+1, rec["step"], "rank %d", i)
				}
			}
			requireAllClose(t, statesOf(out), faultFree(t, cfg, 6, 2), modelSize(t, cfg))
			requireAllClose(t, statesOf(out), faultFree(t, cfg, 4, 2), modelSize(t, cfg))
		})
	}
}

func withoutTook(r Recovery) Recovery {
	r.Took = 0
	return r
}

// atBoundary stops every first-world rank after step 10 (a new round
// between steps).
func atBoundary(_, step int, _ context.CancelFunc) error {
	if step == 10 {
		return errBoundary
	}
	return nil
}

// TestReformChangesLayout: the world grows or shrinks at a step boundary
// or after a loss, with fresh workers taking their whole slice from
// peers and shard sizes that change, so that ranks fetch ranges from
// holders whose slices were cut otherwise; the end is allclose to the
// fault-free run on the first world.
func TestReformChangesLayout(t *testing.T) {
	vanish3 := func(old, step int, cancel context.CancelFunc) error {
		if old == 3 && step == 10 {
			cancel()
		}
		return nil
	}
	tests := []struct {
		name string
		mode string
		sc   scenario
	}{
		{"hsdp 2x2 grows to 3x2", config.ModeHSDP, scenario{first: 4, firstPerNode: 2, second: 6, secondPerNode: 2,
			procs: []process{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {-1, 4}, {-1, 5}}, afterStep: atBoundary}},
		{"fsdp 1x2 grows to 1x3, the fresh rank in the middle", config.ModeFSDP, scenario{first: 2, firstPerNode: 2, second: 3, secondPerNode: 3,
			procs: []process{{0, 0}, {1, 2}, {-1, 1}}, afterStep: atBoundary}},
		{"fsdp 1x2 grows to 1x3, in messages of 1000 elements", config.ModeFSDP, scenario{first: 2, firstPerNode: 2, second: 3, secondPerNode: 3,
			procs: []process{{0, 0}, {1, 2}, {-1, 1}}, afterStep: atBoundary, messageElems: 1000}},
		{"hsdp 2x2 loses a rank and becomes 1x3", config.ModeHSDP, scenario{first: 4, firstPerNode: 2, second: 3, secondPerNode: 3,
			procs: []process{{0, 0}, {1, 1}, {2, 2}, {3, -1}}, afterStep: vanish3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.sc.cfg = reformConfig(t, tc.mode)
			n := modelSize(t, tc.sc.cfg)
			out := play(t, tc.sc)
			var fetched int64
			for i, o := range out {
				p := tc.sc.procs[i]
				if p.next < 0 {
					continue
				}
				require.NoError(t, o.err, "process %d", i)
				require.Equal(t, recovery.Peers, o.rec.Source, "process %d", i)
				require.EqualValues(t, 10, o.rec.Step, "process %d", i)
				require.Zero(t, o.rec.Redone)
				if p.old < 0 {
					whole := 12 * int64(min(o.state.Hi, n)-o.state.Lo)
					require.Equal(t, whole, o.rec.Received, "a fresh rank receives its whole slice (12 bytes an element)")
					require.Equal(t, []int{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, o.steps, "fresh rank %d", p.next)
				}
				fetched += o.rec.Received
			}
			require.Positive(t, fetched)
			requireAllClose(t, statesOf(out), faultFree(t, tc.sc.cfg, tc.sc.first, tc.sc.firstPerNode), n)
		})
	}
}

// TestReformRollsBackADivergedStep: ranks that differ by one optimizer
// update go back to the last step every rank completed, made to happen
// deterministically by fault hooks; the world keeps its layout, so the
// end is bit for bit the fault-free run's. The metrics files keep the
// record of a step that was completed and redone, marked with its round,
// and their history has every step once.
func TestReformRollsBackADivergedStep(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(old int, tr *Trainer)
		redone int
		// completed11 are the ranks that completed step 11 (and redo it)
		completed11 []int
	}{
		{"only rank 0 applied update 11 (and completed the step: no gather follows the update)", func(old int, tr *Trainer) {
			if old != 0 {
				tr.hooks.beforeUpdate = failAt(11)
			}
		}, 1, []int{0}},
		{"replica 1 applied update 11 but did not complete the step; replica 0 completed step 11", func(old int, tr *Trainer) {
			if old >= 2 {
				tr.hooks.afterUpdate = failAt(11)
			}
		}, 1, []int{0, 1}},
	}
	// hsdp on 2 nodes of 2 keeps the copy apart from the gradient sum;
	// fsdp (one replica) and ddp (one shard) keep it in the sum's memory
	// and give it up at the first reduction of the step after the update
	// (see rollback): ranks that went on after completing step 11 hold
	// no copy of step 10 then, and the others must cover it.
	for _, mode := range []string{config.ModeHSDP, config.ModeFSDP, config.ModeDDP} {
		cfg := reformConfig(t, mode)
		want := faultFree(t, cfg, 4, 2)
		for _, tc := range tests {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				out := play(t, scenario{cfg: cfg, first: 4, firstPerNode: 2, second: 4, secondPerNode: 2,
					procs: []process{{0, 0}, {1, 1}, {2, 2}, {3, 3}}, setup: tc.setup, metrics: filepath.Join(dir, "m{rank}.jsonl")})
				for i, o := range out {
					require.Error(t, o.firstErr, "rank %d", i)
					require.NoError(t, o.err, "rank %d", i)
					completed11 := slices.Contains(tc.completed11, i)
					// In ddp a rank that completed step 11 reduced a gradient of
					// step 12 on its own (no collective comes first) and gave its
					// copy up: it takes step 10 from a peer. In fsdp the forward
					// pass's first gather fails first; in hsdp the copy has memory
					// of its own.
					rec := withoutTook(o.rec)
					if mode == config.ModeDDP && completed11 {
						require.Positive(t, rec.Received, "rank %d: gave its copy up", i)
						rec.Received = 0
					}
					require.Equal(t, Recovery{Source: recovery.Peers, Step: 10, Redone: tc.redone}, rec, "rank %d", i)
					require.Equal(t, want[i], o.state, "rank %d: bit for bit the fault-free run", i)
					recs, err := metrics.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.jsonl", i)))
					require.NoError(t, err)
					require.Equal(t, slices.Concat(steps(1, 10, 0), steps(11, 11, 0)[:b2i(completed11)], steps(11, 20, 1)), roundsOf(recs),
						"rank %d: the records of both worlds, step 11 twice where it was completed and redone", i)
					require.Equal(t, slices.Concat(steps(1, 10, 0), steps(11, 20, 1)), roundsOf(metrics.History(recs)), "rank %d: every step once", i)
				}
			})
		}
	}
}

func failAt(step int) func(int) error {
	return func(s int) error {
		if s == step {
			return errInjected
		}
		return nil
	}
}

// TestExchangeWithoutCover: when no step is held in full, every rank gets
// recovery.None and a Trainer as New made it.
func TestExchangeWithoutCover(t *testing.T) {
	cfg := reformConfig(t, config.ModeFSDP)
	fresh, err := New(context.Background(), Config{Train: cfg, Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1},
		Threads: 1, Dataset: text()})
	require.NoError(t, err)
	want := copyState(fresh.State())
	require.NoError(t, fresh.Close())

	t.Run("fsdp 1x2 loses rank 1", func(t *testing.T) {
		out := play(t, scenario{cfg: cfg, first: 2, firstPerNode: 2, second: 1, secondPerNode: 1,
			procs: []process{{0, 0}, {1, -1}},
			afterStep: func(old, step int, cancel context.CancelFunc) error {
				if old == 1 && step == 5 {
					cancel()
				}
				return nil
			}})
		requirePeerError(t, out[0].firstErr, "rank 0")
		require.NoError(t, out[0].err)
		require.Equal(t, Recovery{Source: recovery.None, Redone: 5}, withoutTook(out[0].rec), "from the seed, the 5 steps done are redone")
		require.Len(t, out[0].steps, 5+20, "the second Run starts from step 0")
	})
	t.Run("a fresh job", func(t *testing.T) {
		errs := worldtest.New(t, "fresh", 2, 2).Run(func(w distenv.Worker) error {
			r := w.Rank
			tr, err := New(context.Background(), Config{Train: cfg, Worker: w, Threads: 1, Dataset: text(), CommTimeout: 30 * time.Second})
			if err != nil {
				return err
			}
			defer tr.Close()
			rec, err := tr.Exchange(context.Background(), nil)
			if err != nil {
				return err
			}
			if rec.Source != recovery.None {
				return fmt.Errorf("source %v, want none", rec.Source)
			}
			s := tr.State()
			if s.Step != 0 || !slices.Equal(s.Params, want.Params[s.Lo:s.Hi]) {
				return fmt.Errorf("rank %d is not as New made it", r)
			}
			return nil
		})
		testutil.RequireRanks(t, errs)
	})
}

// TestExchangeDetectsCorruption: a payload changed after its checksum
// was taken fails the exchange on every rank, naming the sender, and no
// rank installs anything.
func TestExchangeDetectsCorruption(t *testing.T) {
	cfg := reformConfig(t, config.ModeFSDP)
	out := play(t, scenario{cfg: cfg, first: 2, firstPerNode: 2, second: 3, secondPerNode: 3,
		procs: []process{{0, 0}, {1, 2}, {-1, 1}}, afterStep: atBoundary,
		setup: func(old int, tr *Trainer) {
			if old == 0 {
				tr.hooks.corrupt = func(b []byte) { b[0] ^= 1 }
			}
		}})
	require.ErrorContains(t, out[2].err, "state from rank 0 fails its crc32c checksum", "the fresh rank 1 receives from rank 0")
	for _, o := range out[:2] {
		require.ErrorContains(t, o.err, "rank 1 received from rank 0 fails its crc32c checksum")
	}
}

// stoppingAtStep3 is a Trainer of cfg in a world of one whose AfterStep
// fails with errBoundary after step 3; it is closed when t ends.
func stoppingAtStep3(t *testing.T, cfg config.Config) *Trainer {
	t.Helper()
	one := distenv.Worker{WorldSize: 1, LocalWorldSize: 1}
	tr, err := New(context.Background(), Config{Train: cfg, Worker: one, Threads: 1, Dataset: text(),
		AfterStep: func(_ *Trainer, rec metrics.Record) error {
			if rec.Step == 3 {
				return errBoundary
			}
			return nil
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// TestReformKeepsStateAfterAnError: a world that the batch does not
// split over is refused with the sizes that work, and the state stays
// for the next Reform.
func TestReformKeepsStateAfterAnError(t *testing.T) {
	cfg := reformConfig(t, config.ModeDDP)
	tr := stoppingAtStep3(t, cfg)
	one := distenv.Worker{WorldSize: 1, LocalWorldSize: 1}
	_, err := tr.Run(context.Background())
	require.ErrorIs(t, err, errBoundary)
	_, err = tr.Reform(context.Background(), distenv.Worker{WorldSize: 5, LocalWorldSize: 5, MasterAddr: "127.0.0.1", MasterPort: 1}, nil)
	require.ErrorContains(t, err, "world sizes that work: 1, 2, 3, 4, 6, 12")
	rec, err := tr.Reform(context.Background(), one, nil)
	require.NoError(t, err)
	require.Equal(t, Recovery{Source: recovery.Peers, Step: 3}, withoutTook(rec))
}

// stepRound is a record's step and round.
type stepRound struct{ step, round int }

// steps is the steps from..to of round.
func steps(from, to, round int) []stepRound {
	var s []stepRound
	for i := from; i <= to; i++ {
		s = append(s, stepRound{i, round})
	}
	return s
}

// roundsOf is the steps and rounds of recs.
func roundsOf(recs []metrics.Record) []stepRound {
	var out []stepRound
	for _, r := range recs {
		out = append(out, stepRound{r.Step, r.Round})
	}
	return out
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
