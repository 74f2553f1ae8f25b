package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/data"
	"github.com/gorun/gorun/trainer/internal/worldtest"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/profile"
	"github.com/gorun/gorun/trainer/recovery"
)

// An idle kernels team lets go of its goroutines within ~20 ms by itself (tested in kernels);
// goleak need not wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/gorun/gorun/trainer/kernels.(*team).work"))
}

// tiny is a model that trains in milliseconds a step.
var tiny = []string{"model.layers=1", "model.d_model=16", "model.heads=2", "model.context=16",
	"train.global_batch=8", "train.micro_batch=2", "train.steps=8", "train.metrics=''",
	"optim.warmup=4", "optim.lr=1e-2"}

func tinyConfig(t *testing.T, sets ...string) config.Config {
	t.Helper()
	cfg, err := config.Parse("/nowhere/train.toml", []byte(`[data]
files = ["unused.txt"]
`), append(append([]string(nil), tiny...), sets...))
	require.NoError(t, err)
	return cfg
}

func text() *data.Dataset {
	return data.New([]byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", 40) +
		strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 40)))
}

// datasetOf is the text cfg trains on in a test: its built-in corpus when
// data.files names one (examples/train.toml), else text().
func datasetOf(t *testing.T, cfg config.Config) *data.Dataset {
	t.Helper()
	if len(cfg.Data.Files) == 0 || !data.IsBuiltin(cfg.Data.Files[0]) {
		return text()
	}
	ds, err := data.Load(cfg.Data.Files)
	require.NoError(t, err)
	return ds
}

// rankRun is what one rank of an in-process run left behind.
type rankRun struct {
	losses   []float64      // mean loss of each step Run took
	mfus     []float64      // the MFU of each step's record
	snapshot recovery.State // the State after step runOpts.snapshotAt
	state    recovery.State // the State at the end
	err      error          // from New or Run
	result   Result         // from Run
	log      *bytes.Buffer
	// checkpointing is whether the rank's model recomputed activations
	// (model.Model.Checkpointing), read after its first step.
	checkpointing bool
}

// runOpts varies an in-process run.
type runOpts struct {
	restore    []recovery.State // per rank: restored before Run
	snapshotAt int              // step after which rankRun.snapshot is taken
	stopRank   int              // rank whose context is cancelled after step stopAt
	stopAt     int              // 0: no rank is stopped
	profile    bool             // Config.Profile
}

// runWorld trains cfg on size ranks (perNode to a node), each in its own
// goroutine with its own Trainer and comm.World over loopback sockets.
func runWorld(t *testing.T, cfg config.Config, size, perNode int, o runOpts) []rankRun {
	t.Helper()
	ds := datasetOf(t, cfg)
	out := make([]rankRun, size)
	errs := worldtest.New(t, "trainer-test", size, perNode).Run(func(w distenv.Worker) error {
		r := w.Rank
		res := &out[r]
		res.log = &bytes.Buffer{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := Config{Train: cfg, Worker: w, Threads: 1, Dataset: ds, CommTimeout: 10 * time.Second,
			Profile: o.profile, Log: res.log,
			AfterStep: func(tr *Trainer, rec metrics.Record) error {
				res.losses = append(res.losses, rec.Loss)
				res.mfus = append(res.mfus, rec.MFU)
				res.checkpointing = tr.model.Checkpointing()
				if rec.Step == o.snapshotAt {
					res.snapshot = copyState(tr.State())
				}
				if rec.Step == o.stopAt && r == o.stopRank {
					cancel()
				}
				return nil
			}}
		tr, err := New(ctx, c)
		if err != nil {
			return err
		}
		defer tr.Close()
		if o.restore != nil {
			if err := tr.Restore(o.restore[r]); err != nil {
				return err
			}
		}
		res.result, err = tr.Run(ctx)
		res.state = copyState(tr.State())
		return err
	})
	for r, err := range errs {
		out[r].err = err
	}
	return out
}

func copyState(s recovery.State) recovery.State {
	s.Params, s.M, s.V = clone(s.Params), clone(s.M), clone(s.V)
	return s
}

func clone(s []float32) []float32 { return append([]float32(nil), s...) }

func maxRelDiff(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i])/math.Abs(b[i]))
	}
	return d
}

// wholeState is the whole flat buffer of a run's final parameters and
// AdamW moments, its first n elements, from the slices of its ranks (any
// rank owning an element holds the same bits: replicas are compared on
// their own).
func wholeState(runs []rankRun, n int) (params, m, v []float32) {
	params, m, v = make([]float32, n), make([]float32, n), make([]float32, n)
	for _, run := range runs {
		s := run.state
		hi := min(s.Hi, n)
		if s.Lo >= hi {
			continue
		}
		copy(params[s.Lo:hi], s.Params)
		copy(m[s.Lo:hi], s.M)
		copy(v[s.Lo:hi], s.V)
	}
	return params, m, v
}

// requireSameBits fails unless got and want hold the same float32 bits
// (-0 is not 0), naming the first element that differs.
func requireSameBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			var differ int
			for j := i; j < len(want); j++ {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					differ++
				}
			}
			require.Failf(t, "not the same bits", "%s: element %d is %v, want %v (%d of %d elements differ)", what, i, got[i], want[i], differ, len(want))
		}
	}
}

// requireSameLosses fails unless got and want are the same float64 bits, step by step.
func requireSameLosses(t *testing.T, want, got []float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		require.Equal(t, math.Float64bits(want[i]), math.Float64bits(got[i]), "%s: the loss of step %d is %v, want %v", what, i+1, got[i], want[i])
	}
}

// TestLayoutsMatchOneProcess is docs/design.md's invariant, to the bit: on the
// same global batch in the same units (micro batches of micro_batch
// samples), every layout (ddp, zero1, zero2, fsdp = zero3, hsdp), every
// world size that divides the batch and so every count of micro batches a
// rank takes ends with one process's final parameters and AdamW moments,
// bit for bit, and replicas of a slice hold the same bits.
//
// The loss of every step is one process's bits too, except where a rank
// takes a number of micro batches that is not a power of two: the world's
// loss is the mean of the ranks' mean losses, and a rank's mean (its sum
// over 3 units divided by 3) is rounded before the world adds them, so the
// last bit of the float64 loss can differ (2e-16 relative, seen at world 2
// on 6 units). The gradient is unaffected: it is the sum over every unit,
// divided once by their number (roundMean). Micro batches of another size
// are other units of summation, and not the same bits (TestAccumulationMatchesOneBigBatch).
func TestLayoutsMatchOneProcess(t *testing.T) {
	six := []string{"train.global_batch=12"} // 6 units of 2 sequences
	tests := []struct {
		name          string
		batch         []string // the reference's sets too: one process on the same batch
		mode          string
		size, perNode int
		shards        int  // ranks r and r+shards hold the same slice
		lossBits      bool // the loss of every step has one process's bits
	}{
		{"ddp 2x1, 2 micro batches a rank", nil, config.ModeDDP, 2, 2, 1, true},
		{"ddp 4x1, 1 micro batch a rank", nil, config.ModeDDP, 4, 4, 1, true},
		{"fsdp 1x2", nil, config.ModeFSDP, 2, 2, 2, true},
		{"fsdp 1x4", nil, config.ModeFSDP, 4, 4, 4, true},
		{"zero1 1x2", nil, config.ModeZeRO1, 2, 2, 2, true},
		{"zero2 1x4", nil, config.ModeZeRO2, 4, 4, 4, true},
		{"hsdp 2x2", nil, config.ModeHSDP, 4, 2, 2, true},
		{"hsdp 4x1", nil, config.ModeHSDP, 4, 1, 1, true},
		{"6 units: ddp 3x1, 2 micro batches a rank", six, config.ModeDDP, 3, 3, 1, true},
		{"6 units: fsdp 1x3", six, config.ModeFSDP, 3, 3, 3, true},
		{"6 units: hsdp 2x3", six, config.ModeHSDP, 6, 3, 3, true},
		{"6 units: hsdp 3x2", six, config.ModeHSDP, 6, 2, 2, true},
		{"6 units: ddp 2x1, 3 micro batches a rank", six, config.ModeDDP, 2, 2, 1, false},
	}
	type reference struct {
		run     rankRun
		p, m, v []float32
	}
	refs := map[string]reference{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.Join(tc.batch, " ")
			ref, ok := refs[key]
			if !ok {
				ref.run = runWorld(t, tinyConfig(t, tc.batch...), 1, 1, runOpts{})[0]
				require.NoError(t, ref.run.err)
				require.Len(t, ref.run.losses, 8)
				require.Less(t, ref.run.losses[7], ref.run.losses[0], "it learns")
				for _, mfu := range ref.run.mfus {
					require.True(t, mfu > 0 && !math.IsInf(mfu, 0), "every record carries an MFU, got %v", mfu)
				}
				ref.p, ref.m, ref.v = wholeState([]rankRun{ref.run}, len(ref.run.state.Params))
				refs[key] = ref
			}
			runs := runWorld(t, tinyConfig(t, append([]string{"parallel.mode=" + tc.mode}, tc.batch...)...), tc.size, tc.perNode, runOpts{})
			for r, run := range runs {
				require.NoError(t, run.err, "rank %d", r)
				require.Equal(t, runs[0].losses, run.losses, "every rank has the same mean loss")
				replica := runs[r%tc.shards]
				require.Equal(t, replica.state, run.state, "ranks %d and %d own the same slice", r, r%tc.shards)
			}
			if tc.lossBits {
				requireSameLosses(t, ref.run.losses, runs[0].losses, "the loss against one process")
			} else {
				require.Less(t, maxRelDiff(runs[0].losses, ref.run.losses), 1e-15, "the loss against one process")
			}
			p, m, v := wholeState(runs, len(ref.p))
			requireSameBits(t, ref.p, p, "the final parameters against one process")
			requireSameBits(t, ref.m, m, "AdamW's first moments against one process")
			requireSameBits(t, ref.v, v, "AdamW's second moments against one process")
		})
	}
}

// TestBlockPartsMatchOneProcess: on a model whose blocks are large enough
// to be gathered and reduced in parts (model.Layout.Units), fsdp ends with
// one process's bits, as zero1 does, which reduces the whole at once.
func TestBlockPartsMatchOneProcess(t *testing.T) {
	sets := []string{"model.d_model=320", "model.heads=4", "model.context=8", "train.steps=3", "optim.warmup=2"}
	cfg := tinyConfig(t, sets...)
	require.Len(t, model.NewLayout(model.Config{Layers: 1, DModel: 320, Heads: 4, Context: 8, Vocab: config.Vocab}).Units(), 6,
		"the block is four units")
	one := runWorld(t, cfg, 1, 1, runOpts{})[0]
	require.NoError(t, one.err)
	p1, m1, v1 := wholeState([]rankRun{one}, len(one.state.Params))
	for _, mode := range []string{config.ModeFSDP, config.ModeZeRO1} {
		runs := runWorld(t, tinyConfig(t, append(sets, "parallel.mode="+mode)...), 2, 2, runOpts{})
		for r := range runs {
			require.NoError(t, runs[r].err, "%s rank %d", mode, r)
			requireSameLosses(t, one.losses, runs[r].losses, mode+": the loss against one process")
		}
		p, m, v := wholeState(runs, len(p1))
		requireSameBits(t, p1, p, mode+": the final parameters against one process")
		requireSameBits(t, m1, m, mode+": AdamW's first moments against one process")
		requireSameBits(t, v1, v, mode+": AdamW's second moments against one process")
	}
}

// TestAccumulationMatchesOneBigBatch: four micro steps of 2 sequences
// follow one step of 8, but not to the bit: a unit's gradient is a float32
// sum over its samples inside the matrix products, so units of another
// size round differently (the loss differed by 5.5e-8 relative at most
// over 20 steps when measured).
func TestAccumulationMatchesOneBigBatch(t *testing.T) {
	acc := runWorld(t, tinyConfig(t), 1, 1, runOpts{})[0]
	big := runWorld(t, tinyConfig(t, "train.micro_batch=8"), 1, 1, runOpts{})[0]
	require.NoError(t, acc.err)
	require.NoError(t, big.err)
	require.Less(t, maxRelDiff(acc.losses, big.losses), 1e-6)
}

// TestActivationCheckpointingGivesTheSameBits: a whole run with
// [train] activation_checkpointing on takes every step with the loss of the
// run without it, and ends with its parameters and AdamW moments, bit for
// bit, in one process and sharded (fsdp, whose units are gathered again
// for the recomputation).
func TestActivationCheckpointingGivesTheSameBits(t *testing.T) {
	// Three blocks: the last block's activations are never recomputed, so a
	// model needs two or more for checkpointing to do anything.
	deep := []string{"model.layers=3"}
	tests := []struct {
		name          string
		mode          string
		size, perNode int
	}{
		{"one process", config.ModeDDP, 1, 1},
		{"fsdp 1x2", config.ModeFSDP, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			off := runWorld(t, tinyConfig(t, append(deep, "parallel.mode="+tc.mode)...), tc.size, tc.perNode, runOpts{})
			on := runWorld(t, tinyConfig(t, append(deep, "parallel.mode="+tc.mode, "train.activation_checkpointing=true")...), tc.size, tc.perNode, runOpts{})
			for r := range on {
				require.NoError(t, off[r].err, "off, rank %d", r)
				require.NoError(t, on[r].err, "on, rank %d", r)
				require.False(t, off[r].checkpointing, "off, rank %d: the model recomputes", r)
				require.True(t, on[r].checkpointing, "on, rank %d: the model does not recompute", r)
				require.Len(t, on[r].losses, 8)
				requireSameLosses(t, off[r].losses, on[r].losses, fmt.Sprintf("rank %d: the loss with checkpointing against without", r))
				requireSameBits(t, off[r].state.Params, on[r].state.Params, fmt.Sprintf("rank %d: the final parameters", r))
				requireSameBits(t, off[r].state.M, on[r].state.M, fmt.Sprintf("rank %d: AdamW's first moments", r))
				requireSameBits(t, off[r].state.V, on[r].state.V, fmt.Sprintf("rank %d: AdamW's second moments", r))
			}
			require.Less(t, on[0].losses[7], on[0].losses[0], "it learns")
		})
	}
}

// TestRestoreResumes: ranks restored from the State they had after step 3
// take steps 4..8 bit for bit as the run that never stopped.
func TestRestoreResumes(t *testing.T) {
	cfg := tinyConfig(t, "parallel.mode=fsdp")
	full := runWorld(t, cfg, 2, 2, runOpts{snapshotAt: 3})
	saved := make([]recovery.State, len(full))
	for r, run := range full {
		require.NoError(t, run.err)
		require.Equal(t, int64(3), run.snapshot.Step)
		require.Equal(t, int64(3*8), run.snapshot.Sample, "the first sample of step 4")
		saved[r] = run.snapshot
	}
	resumed := runWorld(t, cfg, 2, 2, runOpts{restore: saved})
	for r, run := range resumed {
		require.NoError(t, run.err)
		require.Equal(t, full[r].losses[3:], run.losses)
		require.Equal(t, full[r].state, run.state)
	}
}

func TestRestoreRejectsAnotherState(t *testing.T) {
	tr, err := New(context.Background(), Config{Train: tinyConfig(t, "parallel.mode=fsdp"),
		Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1}, Threads: 1, Dataset: text()})
	require.NoError(t, err)
	defer tr.Close()
	good := copyState(tr.State())
	tests := []struct {
		name string
		edit func(*recovery.State)
		want string
	}{
		{"another slice", func(s *recovery.State) { s.Lo++ }, "this rank owns"},
		{"short moments", func(s *recovery.State) { s.M = s.M[1:] }, "want"},
		{"step past the run", func(s *recovery.State) { s.Step, s.Sample = 9, 72 }, "step 9 outside 0 .. 8"},
		{"sample of another batch", func(s *recovery.State) { s.Step, s.Sample = 2, 32 }, "does not start step 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := copyState(good)
			tc.edit(&s)
			require.ErrorContains(t, tr.Restore(s), tc.want)
			require.Equal(t, good, copyState(tr.State()), "unchanged")
		})
	}
}

// TestRestoreInPlace: fill writes into the trainer's own buffers; a
// failing fill, or a step and sample that do not fit, leave the trainer as
// New made it; a trainer that holds a step is refused.
func TestRestoreInPlace(t *testing.T) {
	newTrainer := func(t *testing.T) *Trainer {
		tr, err := New(context.Background(), Config{Train: tinyConfig(t, "parallel.mode=fsdp"),
			Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1}, Threads: 1, Dataset: text()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	seed := copyState(newTrainer(t).State())
	errFill := errors.New("fill failed")
	tests := []struct {
		name         string
		step, sample int64
		fillErr      error
		want         string // "" : restored
	}{
		{"step 2", 2, 16, nil, ""},
		{"fill fails", 2, 16, errFill, "fill failed"},
		{"step past the run", 9, 72, nil, "step 9 outside 0 .. 8"},
		{"sample of another batch", 2, 32, nil, "does not start step 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrainer(t)
			err := tr.RestoreInPlace(func(dst recovery.Slice) (int64, int64, error) {
				require.Same(t, &tr.params[0], &dst.Params[0], "the trainer's own buffers")
				for i := range dst.Params {
					dst.Params[i], dst.M[i], dst.V[i] = 1, 2, 3
				}
				return tc.step, tc.sample, tc.fillErr
			})
			if tc.want == "" {
				require.NoError(t, err)
				s := tr.State()
				require.EqualValues(t, 2, s.Step)
				require.Equal(t, float32(3), s.V[len(s.V)-1])
				require.Equal(t, live, tr.recovery.phase)
				require.ErrorContains(t, tr.RestoreInPlace(func(recovery.Slice) (int64, int64, error) {
					t.Fatal("fill called on a trainer that holds a step")
					return 0, 0, nil
				}), "refused in phase live")
				return
			}
			require.ErrorContains(t, err, tc.want)
			if tc.fillErr != nil {
				require.ErrorIs(t, err, tc.fillErr)
			}
			require.Equal(t, seed, copyState(tr.State()), "as New made it")
			require.Equal(t, fresh, tr.recovery.phase)
		})
	}
}

// TestPeerStopNamesIt: when one rank stops, the others fail at once with
// an error naming it, and the stopped rank reports its cancellation.
func TestPeerStopNamesIt(t *testing.T) {
	runs := runWorld(t, tinyConfig(t, "parallel.mode=hsdp", "train.steps=1000"), 4, 2,
		runOpts{stopRank: 3, stopAt: 2})
	require.ErrorIs(t, runs[3].err, context.Canceled)
	for r := range 3 {
		var pe *comm.PeerError
		require.ErrorAs(t, runs[r].err, &pe, "rank %d", r)
		require.Contains(t, runs[r].err.Error(), "trainer: step 3")
		require.Less(t, len(runs[r].losses), 4, "rank %d went on", r)
	}
	var pe *comm.PeerError
	require.ErrorAs(t, runs[1].err, &pe)
	require.Equal(t, 3, pe.Rank, "rank 1 shares its replica group with rank 3")
}

// TestProfile: with Config.Profile every metrics record carries a profile
// whose phases are non-negative and add up to the step time (the record's
// tokens_per_s agrees with it), and rank 0 ends with a table naming every
// phase; without it records carry none.
func TestProfile(t *testing.T) {
	tests := []struct {
		name          string
		mode          string
		size, perNode int
		profile       bool
	}{
		{"one process", config.ModeDDP, 1, 1, true},
		{"fsdp on 2 ranks", config.ModeFSDP, 2, 2, true},
		{"off", config.ModeDDP, 1, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := tinyConfig(t, "parallel.mode="+tc.mode, "train.metrics='"+filepath.Join(dir, "m{rank}.jsonl")+"'")
			runs := runWorld(t, cfg, tc.size, tc.perNode, runOpts{profile: tc.profile})
			tokensPerStep := float64(cfg.Train.GlobalBatch * cfg.Model.Context)
			for r, run := range runs {
				require.NoError(t, run.err, "rank %d", r)
				recs := readRecords(t, filepath.Join(dir, fmt.Sprintf("m%d.jsonl", r)))
				require.Len(t, recs, cfg.Train.Steps)
				if !tc.profile {
					require.NotContains(t, recs[0], "profile")
					require.Nil(t, run.result.Profile)
					require.NotContains(t, run.log.String(), "profile:")
					continue
				}
				for _, rec := range recs {
					prof, ok := rec["profile"].(map[string]any)
					require.True(t, ok, "step %v has a profile object: %v", rec["step"], rec)
					stepS := prof["step_s"].(float64)
					require.Greater(t, stepS, 0.0)
					require.InEpsilon(t, tokensPerStep/rec["tokens_per_s"].(float64), stepS, 1e-6, "step_s is the step the record's tokens/s measures")
					var sum float64
					for p := range profile.NumPhases {
						v, ok := prof[p.String()+"_s"].(float64)
						require.True(t, ok, "phase %v in %v", p, prof)
						require.GreaterOrEqual(t, v, 0.0, "phase %v", p)
						sum += v
					}
					require.LessOrEqual(t, sum, stepS*(1+1e-9)+1e-9, "the phases fit in the step")
					require.Greater(t, prof["gemm_s"].(float64), 0.0)
				}
				require.Equal(t, cfg.Train.Steps, run.result.Profile.Steps)
				if tc.size > 1 {
					require.Greater(t, recs[0]["profile"].(map[string]any)["collectives_s"].(float64), 0.0)
				}
			}
			if !tc.profile {
				return
			}
			table := runs[0].log.String()
			require.Contains(t, table, fmt.Sprintf("profile: %d steps", cfg.Train.Steps))
			for p := range profile.NumPhases {
				require.Regexp(t, `(?m)^`+p.String()+`\s`, table)
			}
			for _, run := range runs[1:] {
				require.NotContains(t, run.log.String(), "profile:", "only rank 0 writes the table")
			}
		})
	}
}

// readRecords decodes the JSON lines of a metrics file.
func readRecords(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "line %q", line)
		recs = append(recs, rec)
	}
	return recs
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name          string
		sets          []string
		size, perNode int
		want          string
	}{
		{"batch does not split", nil, 3, 3, "accumulation"},
		{"shard size does not divide", []string{"parallel.shard_size=3", "train.global_batch=16"}, 4, 4, "shard"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := distenv.Worker{Rank: 0, WorldSize: tc.size, LocalWorldSize: tc.perNode, MasterAddr: "127.0.0.1", MasterPort: 1}
			_, err := New(context.Background(), Config{Train: tinyConfig(t, tc.sets...), Worker: w, Dataset: text()})
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestDefaultThreads(t *testing.T) {
	require.GreaterOrEqual(t, DefaultThreads(1000), 1)
	require.GreaterOrEqual(t, DefaultThreads(1), DefaultThreads(2))
	require.Equal(t, DefaultThreads(0), DefaultThreads(1))
}

// BenchmarkStep is one optimizer step of examples/train.toml's model in
// one process on two threads; it reports whole-job tokens per second.
func BenchmarkStep(b *testing.B) {
	cfg, err := config.Parse("/nowhere/train.toml", []byte("[data]\nfiles = [\"unused.txt\"]\n"),
		[]string{"train.metrics=''", "optim.warmup=1", "train.steps=1000000"})
	require.NoError(b, err)
	tr, err := New(context.Background(), Config{Train: cfg, Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1},
		Threads: 2, Dataset: text(), AfterStep: func(tr *Trainer, rec metrics.Record) error {
			if rec.Step >= b.N {
				return errStop
			}
			return nil
		}})
	require.NoError(b, err)
	defer tr.Close()
	b.ResetTimer()
	_, err = tr.Run(context.Background())
	require.ErrorIs(b, err, errStop)
	b.ReportMetric(float64(b.N*cfg.Train.GlobalBatch*cfg.Model.Context)/b.Elapsed().Seconds(), "tokens/s")
}

var errStop = errors.New("enough steps")

// BenchmarkStepWorld is optimizer steps of examples/train.toml's model
// (global batch 32, micro batch 8) on 1 and 2 ranks in this process, one
// thread each, over loopback and shared memory; it reports whole-job
// tokens per second from the step records, the first step left out.
func BenchmarkStepWorld(b *testing.B) {
	for _, ranks := range []int{1, 2} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			cfg, err := config.Parse("/nowhere/train.toml", []byte("[data]\nfiles = [\"unused.txt\"]\n"),
				[]string{"train.metrics=''", "optim.warmup=1", fmt.Sprintf("train.steps=%d", b.N+1)})
			require.NoError(b, err)
			var first, last time.Time
			testutil.RequireRanks(b, worldtest.New(b, "bench", ranks, ranks).Run(func(w distenv.Worker) error {
				r := w.Rank
				tr, err := New(context.Background(), Config{Train: cfg, Worker: w, Threads: 1, Dataset: text(),
					CommTimeout: time.Minute, AfterStep: func(_ *Trainer, rec metrics.Record) error {
						if r == 0 && rec.Step == 1 {
							first = rec.Time
						}
						if r == 0 && rec.Step == b.N+1 {
							last = rec.Time
						}
						return nil
					}})
				if err != nil {
					return err
				}
				defer tr.Close()
				_, err = tr.Run(context.Background())
				return err
			}))
			b.ReportMetric(float64(b.N*cfg.Train.GlobalBatch*cfg.Model.Context)/last.Sub(first).Seconds(), "tokens/s")
		})
	}
}
