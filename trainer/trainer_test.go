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

// TestLayoutsMatchOneProcess is DESIGN.md's invariant: any replicas x
// shards layout follows one process on the same global batch to 1e-5
// relative at every step, and replicas of a slice stay bit-identical.
func TestLayoutsMatchOneProcess(t *testing.T) {
	one := runWorld(t, tinyConfig(t), 1, 1, runOpts{})[0]
	require.NoError(t, one.err)
	require.Len(t, one.losses, 8)
	require.Less(t, one.losses[7], one.losses[0], "it learns")
	for _, mfu := range one.mfus {
		require.True(t, mfu > 0 && !math.IsInf(mfu, 0), "every record carries an MFU, got %v", mfu)
	}

	tests := []struct {
		name                  string
		mode                  string
		size, perNode, shards int
	}{
		{"ddp 2x1", config.ModeDDP, 2, 2, 1},
		{"fsdp 1x2", config.ModeFSDP, 2, 2, 2},
		{"zero1 1x2", config.ModeZeRO1, 2, 2, 2},
		{"zero2 1x2", config.ModeZeRO2, 2, 2, 2},
		{"zero3 1x4", config.ModeZeRO3, 4, 4, 4},
		{"hsdp 2x2", config.ModeHSDP, 4, 2, 2},
	}
	// The sharded modes of one world sum every element in the same order
	// (one reduce-scatter of the whole, or of one unit at a time), so they
	// end with the same bits.
	sharded := map[string][]recovery.State{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runs := runWorld(t, tinyConfig(t, "parallel.mode="+tc.mode), tc.size, tc.perNode, runOpts{})
			if tc.size == 2 && tc.shards == 2 {
				for _, run := range runs {
					sharded[tc.mode] = append(sharded[tc.mode], run.state)
				}
			}
			for r, run := range runs {
				require.NoError(t, run.err, "rank %d", r)
				require.Less(t, maxRelDiff(run.losses, one.losses), 1e-5, "rank %d", r)
				require.Equal(t, runs[0].losses, run.losses, "every rank has the same mean loss")
				replica := runs[r%tc.shards]
				require.Equal(t, replica.state.Params, run.state.Params, "ranks %d and %d own the same slice", r, r%tc.shards)
				require.Equal(t, replica.state.M, run.state.M)
				require.Equal(t, replica.state.V, run.state.V)
				for i, p := range run.state.Params {
					require.InDelta(t, one.state.Params[run.state.Lo+i], p, 1e-4, "rank %d element %d", r, run.state.Lo+i)
				}
			}
		})
	}
	for _, mode := range []string{config.ModeZeRO1, config.ModeZeRO2} {
		require.Equal(t, sharded[config.ModeFSDP], sharded[mode], "%s and fsdp on the same world: the same bits", mode)
	}
}

// TestBlockPartsMatchOneProcess: on a model whose blocks are large enough
// to be gathered and reduced in parts (model.Layout.Units), fsdp follows
// one process, with the bits of zero1, which reduces the whole at once.
func TestBlockPartsMatchOneProcess(t *testing.T) {
	sets := []string{"model.d_model=320", "model.heads=4", "model.context=8", "train.steps=3", "optim.warmup=2"}
	cfg := tinyConfig(t, sets...)
	require.Len(t, model.NewLayout(model.Config{Layers: 1, DModel: 320, Heads: 4, Context: 8, Vocab: config.Vocab}).Units(), 6,
		"the block is four units")
	one := runWorld(t, cfg, 1, 1, runOpts{})[0]
	require.NoError(t, one.err)
	fsdp := runWorld(t, tinyConfig(t, append(sets, "parallel.mode=fsdp")...), 2, 2, runOpts{})
	zero1 := runWorld(t, tinyConfig(t, append(sets, "parallel.mode=zero1")...), 2, 2, runOpts{})
	for r := range fsdp {
		require.NoError(t, fsdp[r].err, "rank %d", r)
		require.NoError(t, zero1[r].err, "rank %d", r)
		require.Less(t, maxRelDiff(fsdp[r].losses, one.losses), 1e-5, "rank %d", r)
		require.Equal(t, zero1[r].state, fsdp[r].state, "rank %d: fsdp and zero1, the same bits", r)
	}
}

// TestAccumulationMatchesOneBigBatch: four micro steps of 2 sequences are
// one step of 8.
func TestAccumulationMatchesOneBigBatch(t *testing.T) {
	acc := runWorld(t, tinyConfig(t), 1, 1, runOpts{})[0]
	big := runWorld(t, tinyConfig(t, "train.micro_batch=8"), 1, 1, runOpts{})[0]
	require.NoError(t, acc.err)
	require.NoError(t, big.err)
	require.Less(t, maxRelDiff(acc.losses, big.losses), 1e-5)
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
