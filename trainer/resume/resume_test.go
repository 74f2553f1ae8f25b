package resume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/data"
	"github.com/gorun/gorun/trainer/internal/worldtest"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/recovery"
)

// An idle kernels team lets go of its goroutines within ~20 ms by itself (tested in kernels);
// goleak need not wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/gorun/gorun/trainer/kernels.(*team).work"))
}

// The trainer these tests run is a Trainer.
var _ Trainer = (*trainer.Trainer)(nil)

// tiny is a model that trains in milliseconds a step.
var tiny = []string{"model.layers=1", "model.d_model=16", "model.heads=2", "model.context=16",
	"train.global_batch=8", "train.micro_batch=2", "train.steps=8", "train.metrics=''",
	"optim.warmup=4", "optim.lr=1e-2", "checkpoint.every=4", "checkpoint.keep=10"}

// tinyConfig is tiny with its checkpoints in dir, then sets.
func tinyConfig(t *testing.T, dir string, sets ...string) config.Config {
	t.Helper()
	all := append(append(append([]string(nil), tiny...), fmt.Sprintf("checkpoint.dir=%q", dir)), sets...)
	cfg, err := config.Parse("/nowhere/train.toml", []byte("[data]\nfiles = [\"unused.txt\"]\n"), all)
	require.NoError(t, err)
	return cfg
}

func text() *data.Dataset {
	return data.New([]byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", 40) +
		strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 40)))
}

// rankRun is what one rank of an in-process run left behind.
type rankRun struct {
	resumed  *checkpoint.Loaded
	steps    []int // the steps Run took
	snapshot recovery.State
	log      string
	err      error // from New, Resume or Run
}

// opts varies an in-process run.
type opts struct {
	stopRank, stopAt int // stopAt > 0: stopRank requests a requeue stop after step stopAt
	snapshotAt       int // step after which rankRun.snapshot is copied
	// restore, when set, gives each rank's state from its slice [lo, hi) instead of Resume.
	restore func(lo, hi int) recovery.State
}

// runWorld trains cfg with checkpoints on size ranks of one node, each in its own goroutine with
// its own Trainer and comm.World over loopback; stopAt > 0 makes stopRank request a requeue
// stop after that step.
func runWorld(t *testing.T, cfg config.Config, size int, o opts) []rankRun {
	t.Helper()
	ds := text()
	out := make([]rankRun, size)
	errs := worldtest.New(t, "resume-test", size, size).Run(func(w distenv.Worker) error {
		return runRank(cfg, ds, w, o, &out[w.Rank])
	})
	for r, err := range errs {
		out[r].err = err
	}
	return out
}

func runRank(cfg config.Config, ds *data.Dataset, w distenv.Worker, o opts, res *rankRun) (err error) {
	ctx := context.Background()
	var log bytes.Buffer
	defer func() { res.log = log.String() }()
	stop := &Stop{}
	var ck *Checkpointer
	tr, err := trainer.New(ctx, trainer.Config{Train: cfg, Worker: w, Threads: 1, Dataset: ds, CommTimeout: 10 * time.Second,
		AfterStep: func(_ *trainer.Trainer, rec metrics.Record) error {
			res.steps = append(res.steps, rec.Step)
			if o.stopAt > 0 && w.Rank == o.stopRank && rec.Step == o.stopAt {
				stop.Request(StopRequeue)
			}
			if rec.Step == o.snapshotAt {
				s := ck.t.State()
				s.Params, s.M, s.V = slices.Clone(s.Params), slices.Clone(s.M), slices.Clone(s.V)
				res.snapshot = s
			}
			return ck.AfterStep(ctx, rec)
		}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tr.Close()) }()
	if ck, err = New(tr, Config{Train: cfg, Log: &log, Stop: stop}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ck.Close()) }()
	if o.restore != nil {
		s := tr.State()
		if err := tr.Restore(o.restore(s.Lo, s.Hi)); err != nil {
			return err
		}
	} else if res.resumed, err = ck.Resume(ctx); err != nil {
		return err
	}
	_, err = tr.Run(ctx)
	return err
}

func requireOK(t *testing.T, runs []rankRun) {
	t.Helper()
	for r, run := range runs {
		require.NoError(t, run.err, "rank %d", r)
	}
}

// diff compares the newest checkpoints of dirs a and b and returns the largest relative
// difference |a-b|/|b| over all their tensors, which must match in names and shapes.
func diff(t *testing.T, a, b string) float64 {
	t.Helper()
	rep, err := checkpoint.CompareDirs(context.Background(), a, b, checkpoint.Tolerance{})
	require.NoError(t, err)
	var worst float64
	for _, d := range rep.Tensors {
		require.True(t, d.Comparable(), "tensor %s", d.Name)
		worst = max(worst, d.MaxRel)
	}
	return worst
}

// TestTensorsReshard: a state saved by any number of shards loads into any other, element for
// element, with the padding left zero, and the manifest names the tensors in layout order.
func TestTensorsReshard(t *testing.T) {
	layout := model.NewLayout(model.Config{Layers: 1, DModel: 8, Heads: 2, Context: 5, Vocab: 11})
	value := func(i int) float32 { return float32(i) + 0.5 }
	for _, from := range []int{1, 2, 3, 4} {
		for _, to := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("%d-to-%d", from, to), func(t *testing.T) {
				dir := t.TempDir()
				coords := checkpoint.NewLocalGroup(from)
				n := layout.PaddedSize(from)
				errs := testutil.OnRanks(from, func(r int) error {
					lo, hi := r*n/from, (r+1)*n/from
					s := recovery.State{Slice: recovery.Make(3, lo, hi)}
					for i := lo; i < min(hi, layout.Size); i++ {
						s.Params[i-lo], s.M[i-lo], s.V[i-lo] = value(i), -value(i), 2*value(i)
					}
					sv, err := checkpoint.NewSaver(checkpoint.Config{Dir: dir, World: checkpoint.World{Replicas: 1, Shards: from}, Coord: coords[r]})
					if err != nil {
						return err
					}
					return sv.Save(context.Background(), checkpoint.Meta{Step: 3}, Tensors(layout, s))
				})
				require.NoError(t, errors.Join(errs...))

				m, err := checkpoint.ReadManifest(filepath.Join(dir, checkpoint.StepName(3)))
				require.NoError(t, err)
				require.Len(t, m.Tensors, 3*len(layout.Tensors))
				for i, ti := range layout.Tensors {
					require.Equal(t, ti.Name, m.Tensors[i].Name)
					require.Equal(t, PrefixM+ti.Name, m.Tensors[len(layout.Tensors)+i].Name)
					require.Equal(t, PrefixV+ti.Name, m.Tensors[2*len(layout.Tensors)+i].Name)
				}

				n = layout.PaddedSize(to)
				for r := range to {
					lo, hi := r*n/to, (r+1)*n/to
					s := recovery.Make(0, lo, hi)
					_, err := checkpoint.Load(context.Background(), nil, dir, Requests(layout, s))
					require.NoError(t, err)
					for i := lo; i < hi; i++ {
						want := float32(0)
						if i < layout.Size {
							want = value(i)
						}
						require.Equal(t, []float32{want, -want, 2 * want}, []float32{s.Params[i-lo], s.M[i-lo], s.V[i-lo]}, "element %d", i)
					}
				}
			})
		}
	}
}

// TestResumeEquivalence: a run stopped at step 3 (requested on one rank only: every rank stops
// there) and resumed at the same world size ends bit for bit as the run that never stopped.
// Resumed at another world size it ends bit for bit as a run of that size restored in memory
// with the state the first run had after step 3 (so resharding through the checkpoint loses
// nothing), and within float noise of the run that never stopped.
func TestResumeEquivalence(t *testing.T) {
	straightDir, stoppedDir := t.TempDir(), t.TempDir()
	straight := runWorld(t, tinyConfig(t, straightDir), 2, opts{snapshotAt: 3})
	requireOK(t, straight)
	require.Contains(t, straight[0].log, "checkpoint: none in "+straightDir)
	require.Empty(t, straight[1].log, "rank 0 alone logs")

	stopped := runWorld(t, tinyConfig(t, stoppedDir), 2, opts{stopRank: 1, stopAt: 3})
	for r, run := range stopped {
		var se *StoppedError
		require.ErrorAs(t, run.err, &se, "rank %d", r)
		require.Equal(t, &StoppedError{Step: 3, Kind: StopRequeue, Checkpoint: filepath.Join(stoppedDir, "step-00000003")}, se)
		require.Equal(t, []int{1, 2, 3}, run.steps)
	}
	other := t.TempDir()
	require.NoError(t, os.CopyFS(other, os.DirFS(stoppedDir)))

	same := runWorld(t, tinyConfig(t, stoppedDir), 2, opts{})
	requireOK(t, same)
	require.Equal(t, []int{4, 5, 6, 7, 8}, same[0].steps)
	require.Equal(t, int64(3), same[1].resumed.Manifest.Step)
	require.Contains(t, same[0].log, "checkpoint: loading step-00000003: resuming at step 3, sample 24 (saved by 1x2 hsdp")
	require.Zero(t, diff(t, straightDir, stoppedDir), "bit-identical")

	one := runWorld(t, tinyConfig(t, other), 1, opts{})
	requireOK(t, one)
	require.Equal(t, []int{4, 5, 6, 7, 8}, one[0].steps)
	m, err := checkpoint.ReadManifest(filepath.Join(other, "step-00000008"))
	require.NoError(t, err)
	require.Equal(t, checkpoint.World{Replicas: 1, Shards: 1, Mode: "hsdp"}, m.World)

	refDir := t.TempDir()
	full := func(pick func(recovery.State) []float32) []float32 {
		var out []float32
		for _, run := range straight {
			out = append(out, pick(run.snapshot)...)
		}
		return out
	}
	params, mom, v := full(func(s recovery.State) []float32 { return s.Params }),
		full(func(s recovery.State) []float32 { return s.M }), full(func(s recovery.State) []float32 { return s.V })
	ref := runWorld(t, tinyConfig(t, refDir), 1, opts{restore: func(lo, hi int) recovery.State {
		return recovery.State{Sample: 24, Slice: recovery.Slice{Step: 3, Lo: lo, Hi: hi, Params: params[lo:hi], M: mom[lo:hi], V: v[lo:hi]}}
	}})
	requireOK(t, ref)
	require.Zero(t, diff(t, refDir, other), "resharded resume equals an in-memory restore")
	// Element-wise relative differences of values near zero are large (the attention key bias,
	// whose true gradient is 0, is float noise); compare the norm of each tensor instead.
	nd := normDiff(t, straightDir, other)
	t.Logf("2 ranks resumed at 1: largest ||a-b||/||a|| of a tensor %.2e", nd)
	require.Less(t, nd, 1e-4)
}

// normDiff is the largest ||got-ref|| / ||ref|| over the tensors of the newest checkpoints of ref
// and got whose reference is not all zeros, by checkpoint.CompareDirs in norm mode.
func normDiff(t *testing.T, ref, got string) float64 {
	t.Helper()
	rep, err := checkpoint.CompareDirs(context.Background(), got, ref, checkpoint.Tolerance{Norm: true})
	require.NoError(t, err)
	var worst float64
	for _, tr := range rep.Tensors {
		require.True(t, tr.Comparable(), "tensor %s", tr.Name)
		if tr.RefNorm > 0 {
			worst = max(worst, tr.NormRel())
		}
	}
	return worst
}

// TestResumeFallsBack: a corrupt newest checkpoint is skipped for the one before, and rank 0's
// log says which and why; the run then ends as if nothing happened.
func TestResumeFallsBack(t *testing.T) {
	dir, straightDir := t.TempDir(), t.TempDir()
	requireOK(t, runWorld(t, tinyConfig(t, straightDir), 2, opts{}))
	requireOK(t, runWorld(t, tinyConfig(t, dir, "train.steps=6"), 2, opts{})) // steps 4 and 6
	shard := filepath.Join(dir, "step-00000006", "shard-00001.bin")
	b, err := os.ReadFile(shard)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, os.WriteFile(shard, b, 0o644))

	runs := runWorld(t, tinyConfig(t, dir), 2, opts{})
	requireOK(t, runs)
	require.Regexp(t, `checkpoint: checkpoint step-00000006 is corrupt \(rank 1: shard-00001.bin tensor \S+: crc32c mismatch.*\), loading step-00000004: resuming at step 4`, runs[0].log)
	require.Equal(t, []int{5, 6, 7, 8}, runs[1].steps)
	require.Zero(t, diff(t, straightDir, dir))
}

// TestResumeRefusesAnotherConfig: a checkpoint of another model, data, seed, batch or optimizer
// is refused on every rank with an error that says so; steps, layout and checkpointing may change.
func TestResumeRefusesAnotherConfig(t *testing.T) {
	dir := t.TempDir()
	requireOK(t, runWorld(t, tinyConfig(t, dir, "train.steps=4"), 2, opts{}))
	for _, set := range []string{"optim.lr=2e-2", "model.d_model=32", "train.seed=2", "train.global_batch=16"} {
		t.Run(set, func(t *testing.T) {
			for r, run := range runWorld(t, tinyConfig(t, dir, set), 2, opts{}) {
				var me *ConfigMismatchError
				require.ErrorAs(t, run.err, &me, "rank %d", r)
				require.Equal(t, filepath.Join(dir, "step-00000004"), me.Checkpoint)
				require.Contains(t, run.err.Error(), "set checkpoint.dir to another directory to start afresh")
				require.Empty(t, run.steps)
			}
		})
	}
	runs := runWorld(t, tinyConfig(t, dir, "parallel.mode=ddp", "checkpoint.every=1", "checkpoint.keep=1", "train.micro_batch=4"), 2, opts{})
	requireOK(t, runs)
	require.Equal(t, []int{5, 6, 7, 8}, runs[0].steps)
	entries, err := checkpoint.List(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "keep 1")
}

// TestAsyncSaves: with checkpoint.async the periodic saves are written in the background and the
// result is the same as saving in line.
func TestAsyncSaves(t *testing.T) {
	syncDir, asyncDir := t.TempDir(), t.TempDir()
	requireOK(t, runWorld(t, tinyConfig(t, syncDir, "checkpoint.every=1"), 2, opts{}))
	runs := runWorld(t, tinyConfig(t, asyncDir, "checkpoint.every=1", "checkpoint.async=true"), 2, opts{})
	requireOK(t, runs)
	require.Contains(t, runs[0].log, "checkpoint: saving step-00000007 in the background")
	require.Contains(t, runs[0].log, "checkpoint: saved "+filepath.Join(asyncDir, "step-00000008"))
	for _, step := range []string{"step-00000005", "step-00000008"} {
		require.Zero(t, diff(t, filepath.Join(syncDir, step), filepath.Join(asyncDir, step)), step)
	}
}

func TestStopKindString(t *testing.T) {
	for _, tc := range []struct {
		k    StopKind
		want string
	}{{0, "none"}, {StopRequeue, "requeue"}, {StopTerminate, "terminate"}, {StopRequeue | StopTerminate, "requeue+terminate"}, {8, "0x8"}} {
		require.Equal(t, tc.want, tc.k.String())
	}
	var s *Stop
	require.Zero(t, s.Pending())
}
