package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/data"
	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/optim"
	"github.com/gorun/gorun/trainer/profile"
)

// Config is what one rank needs to train.
type Config struct {
	// Train is the loaded, validated train.toml (see config.Load).
	Train config.Config
	// Worker is this rank's place in the job (see distenv.FromEnv). A
	// world of one rank needs no MASTER_ADDR: it opens no sockets.
	Worker distenv.Worker
	// Threads is the number of goroutines the matrix products and the
	// model's row-wise work use; 0 means DefaultThreads(Worker.LocalWorldSize).
	Threads int
	// Metrics is the JSON-lines path (with an optional "{rank}"); ""
	// keeps Train.Train.Metrics.
	Metrics string
	// Log receives rank 0's start line and progress lines; nil discards them.
	Log io.Writer
	// Dataset is the text to train on; nil loads Train.Data.Files.
	Dataset *data.Dataset
	// CommTimeout bounds every wait for a peer; 0 is comm.DefaultTimeout.
	// Once Run has timed a step in a world, the step's collectives wait at
	// most what comm.TimeoutRule makes of the median step time (10 s at
	// least, 10 median steps), and never longer than CommTimeout.
	CommTimeout time.Duration
	// Secret is the job secret the ranks authenticate each other with
	// (comm.Config.Secret); the zero Secret authenticates nothing.
	Secret jobsecret.Secret
	// CommLog receives a line per connection refused by this rank (see
	// comm.Config.Log); nil discards them.
	CommLog io.Writer
	// StopAsked, when set, is asked once per step of Run: when it says
	// yes on any rank, every rank of the world returns ErrStopped from
	// Run at the same step boundary, before that step's update (a round
	// that only adds nodes: the running world goes into it without a rank
	// a step ahead of the others). nil: never.
	StopAsked func() bool
	// SilentAfter and OnPeerSilent report a peer rank this rank heard
	// nothing from for SilentAfter, in every world it connects (see
	// comm.Config.SilentAfter and OnSilent); zero or nil: never.
	SilentAfter  time.Duration
	OnPeerSilent func(rank int)
	// AfterStep, when set, is called on every rank after each optimizer
	// step, once the parameters are gathered again, with the Trainer and
	// the step's figures; the Trainer's State is then the state after
	// that step (the hook for saving checkpoints). An error stops Run with
	// that error.
	AfterStep func(*Trainer, metrics.Record) error
	// Profile times the phases of every step (see package profile): each
	// metrics record carries them, Result.Profile adds them up, and rank 0
	// writes that summary to Log at the end of Run.
	Profile bool
}

// Trainer is one rank of a training run: the model, this rank's slice of
// the parameters and of the AdamW state, and its place in the world.
// Its methods must be called from one goroutine.
type Trainer struct {
	cfg     Config
	plan    hsdp.Plan
	groups  *hsdp.Groups
	world   *comm.World // nil for a world of one rank
	batch   data.Batch
	dataset *data.Dataset
	model   *model.Model
	// modelCfg is the model's shape, for re-initializing the parameters.
	modelCfg model.Config
	eng      *kernels.Engine
	// peakGFLOPS is the fp32 FMA peak of eng's threads, measured once in
	// New; flopsPerToken the model FLOPs of one training token. Together
	// they give every record its MFU.
	peakGFLOPS    float64
	flopsPerToken float64
	optim         optim.Config
	state         optim.State
	// metricsPattern is the metrics path pattern; metrics is its Writer,
	// opened by Run once it knows the step the run goes on from (nil before).
	metricsPattern string
	metrics        *metrics.Writer
	// lastRecord is this rank's record of the last step it completed
	// (every rank makes one; only the ranks with a file write it).
	lastRecord metrics.Record

	// params is this rank's slice [lo, hi) of the padded flat parameters
	// (all of them with one shard): the parameters are sharded at rest,
	// and weights gathers each unit when the model needs it (see units.go).
	params  []float32
	weights *unitWeights
	// grads reduces each unit's gradient into grad64, this rank's slice
	// of the float64 sum of the step's units (micro batches) over the
	// world, which roundMean then turns, in its own memory, into the
	// step's gradient in float32.
	grads  *unitGrads
	grad64 []float64
	// stream runs the shard group's collectives of weights and grads
	// while the passes compute; collectives times what the step waits for
	// them.
	stream      stream
	collectives collectiveTimer
	decay       []kernels.Span // where weight decay applies in the owned slice
	tokens      []byte         // one micro batch
	lo, hi      int            // the owned slice of params

	// rollback holds the owned state as it was before the last optimizer
	// update, so that a rank that applied the update of a step its peers
	// did not finish can go back one step (see Exchange); whether it
	// holds such a step is recovery's phase (updated).
	rollback rollback
	// recovery is this rank's phase (see phase) and what it holds for an
	// exchange; only enter changes it.
	recovery recoveryState
	// stepTimes are the durations of the last steps in this world; the
	// step's collectives wait at most timeoutRule.For their median.
	stepTimes   comm.StepTimes
	timeoutRule comm.TimeoutRule
	// hooks inject faults in tests; the zero value injects none.
	hooks hooks
}

// Result sums up a finished Run.
type Result struct {
	Steps      int     // optimizer steps this Run took
	Loss       float64 // mean loss of the last step over the world
	TokensPerS float64 // whole-job tokens per second over this Run
	// Profile is this rank's phase times added up over the Run; nil
	// unless Config.Profile.
	Profile *profile.Summary
}

// New prepares rank cfg.Worker.Rank: it loads the data, builds the model
// and initializes the parameters from train.seed (the same bits on every
// rank), and for a world of several ranks connects to the others and
// joins the shard and replica groups; that waits for every rank, up to the
// comm timeout, or until ctx ends. It fails on a layout or batch that
// does not fit the world, on data that cannot be read, and on peers that
// do not come; the error names the peer. Close the Trainer when done.
func New(ctx context.Context, cfg Config) (*Trainer, error) {
	w := cfg.Worker
	tc := cfg.Train
	mc := model.Config{Layers: tc.Model.Layers, DModel: tc.Model.DModel, Heads: tc.Model.Heads,
		Context: tc.Model.Context, Vocab: config.Vocab}
	geo, err := geometryFor(tc, w, model.NewLayout(mc))
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	oc := optim.Config{LR: tc.Optim.LR, MinLR: tc.Optim.MinLR, Warmup: tc.Optim.Warmup, Steps: tc.Train.Steps,
		Beta1: tc.Optim.Beta1, Beta2: tc.Optim.Beta2, Eps: tc.Optim.Eps,
		WeightDecay: tc.Optim.WeightDecay, GradClip: tc.Optim.GradClip}
	if err := oc.Validate(); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	ds := cfg.Dataset
	if ds == nil {
		if ds, err = data.Load(tc.Data.Files); err != nil {
			return nil, fmt.Errorf("trainer: %w", err)
		}
	}
	threads := cfg.Threads
	if threads <= 0 {
		threads = DefaultThreads(w.LocalWorldSize)
	}
	prec, err := kernels.ParsePrecision(tc.Train.Precision)
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	eng := kernels.New(threads)
	if prec != kernels.FP32 {
		eng = eng.WithPrecision(prec)
	}
	m, err := model.New(mc, tc.Train.MicroBatch, eng, model.WithActivationCheckpointing(tc.Train.ActivationCheckpointing))
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	t := &Trainer{
		cfg: cfg, modelCfg: mc, dataset: ds, model: m, eng: eng, optim: oc,
		peakGFLOPS: eng.MeasurePeak(), flopsPerToken: mc.TrainFLOPsPerToken(),
		tokens: make([]byte, m.TokensLen()),
	}
	if t.world, t.groups, err = connectWorld(ctx, cfg, w, geo.plan); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	t.setGeometry(geo)
	model.InitRange(mc, t.params, t.lo, tc.Train.Seed)
	t.metricsPattern = cfg.Metrics
	if t.metricsPattern == "" {
		t.metricsPattern = tc.Train.Metrics
	}
	return t, nil
}

// geometry is what depends on the world: this rank's plan, the batch
// split, the padded buffer length and the slice this rank owns.
type geometry struct {
	plan   hsdp.Plan
	batch  data.Batch
	n      int // padded length of the flat buffers
	lo, hi int // this rank's slice
}

// geometryFor checks that tc's layout and batch fit w's world and
// returns the geometry of w's rank.
func geometryFor(tc config.Config, w distenv.Worker, layout model.Layout) (geometry, error) {
	if w.WorldSize < 1 || w.Rank < 0 || w.Rank >= w.WorldSize {
		return geometry{}, fmt.Errorf("rank %d outside world size %d", w.Rank, w.WorldSize)
	}
	replicas, shards, err := tc.Parallel.Layout(w.WorldSize, max(1, w.LocalWorldSize))
	if err != nil {
		return geometry{}, err
	}
	plan, err := hsdp.NewPlan(w.Rank, w.WorldSize, shards)
	if err != nil {
		return geometry{}, err
	}
	if plan.Replicas != replicas {
		return geometry{}, fmt.Errorf("layout %d x %d does not make world size %d", replicas, shards, w.WorldSize)
	}
	if _, err := tc.Accumulation(w.WorldSize); err != nil {
		return geometry{}, err
	}
	batch, err := data.NewBatch(tc.Train.GlobalBatch, tc.Train.MicroBatch, w.WorldSize)
	if err != nil {
		return geometry{}, err
	}
	n := layout.PaddedSize(plan.Shards)
	lo, hi := plan.Owned(n)
	return geometry{plan: plan, batch: batch, n: n, lo: lo, hi: hi}, nil
}

// setGeometry adopts geo with fresh buffers: zero parameters, zero AdamW
// state at step 0 and no rollback copy. It leaves the phase alone: New's
// is fresh, and Reform carried what it held before calling it.
func (t *Trainer) setGeometry(geo geometry) {
	t.plan, t.batch, t.lo, t.hi = geo.plan, geo.batch, geo.lo, geo.hi
	units := t.model.Units()
	mode := t.cfg.Train.Parallel.Mode
	shardedParams := config.ShardsParams(mode) && geo.plan.Shards > 1
	wholeGrads := !config.ShardsGrads(mode) && geo.plan.Shards > 1
	bufs := newUnitBuffersFor(units, shardedParams, wholeGrads)
	t.weights = newUnitWeights(t.groups, units, geo.lo, geo.hi, geo.n, !shardedParams, bufs, &t.stream, &t.collectives)
	t.params = t.weights.owned
	t.grad64, t.rollback = sumAndRollback(geo.hi-geo.lo, sharesGradSum(geo.plan))
	t.decay = t.model.Layout().DecaySpans(geo.lo, geo.hi)
	t.state = optim.NewState(geo.hi - geo.lo)
	t.grads = newUnitGrads(t.groups, units, geo.n, t.grad64, t.claimGradSum, wholeGrads, bufs, &t.stream, &t.collectives)
	t.stepTimes.Reset() // a new world's steps take another time
	t.timeoutRule = comm.TimeoutRule{Ceiling: t.cfg.CommTimeout}
}

// connectWorld connects rank w.Rank to w's world (none for a world of
// one rank) and joins plan's groups on it, waiting for every rank up to
// cfg.CommTimeout or until ctx ends.
func connectWorld(ctx context.Context, cfg Config, w distenv.Worker, plan hsdp.Plan) (*comm.World, *hsdp.Groups, error) {
	var world *comm.World
	if w.WorldSize > 1 {
		cc := comm.ConfigFrom(w, cfg.Secret)
		cc.Timeout, cc.Log = cfg.CommTimeout, cfg.CommLog
		cc.SilentAfter, cc.OnSilent = cfg.SilentAfter, cfg.OnPeerSilent
		var err error
		if world, err = comm.Connect(ctx, cc); err != nil {
			return nil, nil, fmt.Errorf("connect rank %d of %d: %w", w.Rank, w.WorldSize, err)
		}
	}
	groups, err := hsdp.Join(world, plan)
	if err != nil {
		if world != nil {
			_ = world.Close()
		}
		return nil, nil, err
	}
	return world, groups, nil
}

// Plan is this rank's place in the replicas x shards world.
func (t *Trainer) Plan() hsdp.Plan { return t.plan }

// Layout names the tensors of the flat parameter buffer.
func (t *Trainer) Layout() model.Layout { return t.model.Layout() }

// World is this rank's connection to the others, nil in a world of one
// rank. Callers may create groups of their own on it (every rank the same
// groups in the same order, e.g. for checkpointing alongside training) but
// must not close it: Close does, and Run does when its ctx ends. Reform
// replaces it with the next world's (groups made on the old one are gone).
func (t *Trainer) World() *comm.World { return t.world }

// Step is the number of optimizer steps done.
func (t *Trainer) Step() int { return t.state.Step }

// Threads is the number of goroutines the kernels use.
func (t *Trainer) Threads() int { return t.eng.Threads() }

// Describe is the one-line summary rank 0 logs at the start: model size,
// world layout, batch split, threads and data.
func (t *Trainer) Describe() string {
	tc := t.cfg.Train
	mode := tc.Parallel.Mode
	return fmt.Sprintf("trainer: %d parameters (%d layers, d_model %d, %d heads, context %d); world %d = %d replicas x %d shards (%s); "+
		"global batch %d = %d ranks x %d micro steps x %d; %d threads (%s, fp32 peak %.0f GFLOP/s); data %d bytes in %d files; metrics %s",
		tc.Model.Params(), tc.Model.Layers, tc.Model.DModel, tc.Model.Heads, tc.Model.Context,
		t.plan.WorldSize(), t.plan.Replicas, t.plan.Shards, mode,
		tc.Train.GlobalBatch, t.plan.WorldSize(), t.batch.Accumulation(), tc.Train.MicroBatch,
		t.eng.Threads(), t.eng.Kernel(), t.peakGFLOPS, t.dataset.Len(), len(t.dataset.Files()), orNone(metrics.Path(t.metricsPattern, t.cfg.Worker.Rank)))
}

// mfu is the model FLOPs utilisation of this rank at whole-job
// tokPerS: its share of the tokens (every rank trains as many) times the
// FLOPs per token, over its threads' peak.
func (t *Trainer) mfu(tokPerS float64) float64 {
	if t.peakGFLOPS <= 0 {
		return 0
	}
	return tokPerS / float64(t.plan.WorldSize()) * t.flopsPerToken / (t.peakGFLOPS * 1e9)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// ErrStopped is Run's error when Config.StopAsked said yes on a rank of
// the world: every rank stopped at the same step boundary, before that
// step's update, and the world is intact (Reform leaves it in order).
var ErrStopped = errors.New("trainer: stopped at a step boundary, as asked")

// Run trains from the current step (0, or the one Restore set) to
// train.steps. Every rank must call it. Rank 0 writes a progress line to
// cfg.Log every log_every steps; the metrics file gets a record every step,
// marked with this world's round, appended to the records of the worlds
// before (see metrics.Open: records of steps this Run redoes stay, and
// metrics.History reads the job's final line of steps).
// When ctx ends Run aborts the world with ctx's cause (comm.World.Abort:
// a collective blocked on a peer returns at once; the world is closed by
// Reform or Close) and returns that cause; a peer that dies or stalls
// makes it return an error naming that peer's rank (a *comm.PeerError in
// its chain). A peer stalls when a send or receive of the step's
// collectives moves nothing for the timeout of Config.CommTimeout.
//
// After such an error, or an AfterStep error, the Trainer keeps the state
// of the last step every rank completed (see Exchange): Reform it into
// the next world and Run again, or Close it. After any other error it is
// unusable. After a Reform that failed, Run refuses to start: the state
// this rank held is carried over to the next Reform, not in its buffers.
//
// Run is a loop over step, one optimizer step each; complete writes each
// step's record and end finishes the Run.
func (t *Trainer) Run(ctx context.Context) (Result, error) {
	if t.groups == nil {
		return Result{}, errors.New("trainer: run: no world to run in (the last Reform failed)")
	}
	if err := t.enter(event{kind: started, step: t.state.Step, round: t.cfg.Worker.RestartCount}); err != nil {
		return Result{}, fmt.Errorf("trainer: run: %w (the last Reform failed: Reform again or Close)", err)
	}
	if t.world != nil {
		world := t.world
		stop := context.AfterFunc(ctx, func() { world.Abort(context.Cause(ctx)) })
		defer stop()
	}
	if err := t.openMetrics(); err != nil {
		return Result{}, err
	}
	if err := t.recordMissed(); err != nil {
		return Result{}, err
	}
	c := t.newRunClock(time.Now())
	t.model.SetProfile(c.prof)
	for t.state.Step < t.cfg.Train.Train.Steps {
		if err := ctx.Err(); err != nil {
			return c.res, t.runErr(ctx, err)
		}
		rec, waited, err := t.step(ctx, c.prof)
		if err != nil {
			return c.res, err
		}
		if err := t.complete(c, rec, waited); err != nil {
			return c.res, err
		}
	}
	return t.end(ctx, c)
}

// runClock is one Run's clock and tallies: what its records' times and
// rates, its progress lines and its Result are made of.
type runClock struct {
	res                        Result
	start, lastRecord, lastLog time.Time
	stepsAtLog                 int            // res.Steps at the last progress line
	prof                       *profile.Timer // nil, and every lap a no-op, unless profiling
	log                        io.Writer      // rank 0's progress lines; io.Discard on the others
	tokensPerStep              float64        // the whole job's tokens in one step
}

// newRunClock starts a Run's clock at start.
func (t *Trainer) newRunClock(start time.Time) *runClock {
	c := &runClock{start: start, lastRecord: start, lastLog: start, log: t.cfg.Log,
		tokensPerStep: float64(t.cfg.Train.Train.GlobalBatch * t.cfg.Train.Model.Context)}
	if c.log == nil || t.cfg.Worker.Rank != 0 {
		c.log = io.Discard
	}
	if t.cfg.Profile {
		c.prof, c.res.Profile = profile.NewTimer(start), &profile.Summary{}
	}
	return c
}

// step does one optimizer step, the one after t.state.Step: the gathering
// of the whole parameters where the passes read them whole, the passes
// over this rank's micro batches, the replicas' reduction, the world's
// loss and gradient norm (and whether a rank asked to stop: ErrStopped,
// before the update), and the AdamW update of the owned slice, which
// takes the rollback copy as it goes. It
// returns the step's own figures for its record (Step, Loss, LR,
// GradNorm, WorldSize, Rank, Round) and the time it waited for
// collectives.
func (t *Trainer) step(ctx context.Context, prof *profile.Timer) (metrics.Record, time.Duration, error) {
	tc := t.cfg.Train.Train
	step := t.state.Step
	t.collectives = collectiveTimer{prof: prof}
	// Every rank of the shard group sends its slice to this gather only
	// after it completed the step before: see rollback.
	if err := t.weights.refresh(); err != nil {
		return metrics.Record{}, 0, t.runErr(ctx, err)
	}
	lossSum, err := t.accumulate(step, prof)
	if err != nil {
		return metrics.Record{}, 0, t.runErr(ctx, err)
	}
	collStart := time.Now()
	if err := t.groups.ReduceReplicas(t.grad64); err != nil {
		return metrics.Record{}, 0, t.runErr(ctx, err)
	}
	waited := time.Since(collStart)
	prof.Lap(profile.Collectives)
	grad := roundMean(t.grad64, tc.GlobalBatch/tc.MicroBatch)
	ownedSquares := optim.SumSquares(t.eng, grad)
	prof.Lap(profile.Optimizer)
	collStart = time.Now()
	loss, sumSquares, stop, err := t.groups.Stats(lossSum/float64(t.batch.Accumulation()), ownedSquares, t.cfg.StopAsked != nil && t.cfg.StopAsked())
	if err != nil {
		return metrics.Record{}, 0, t.runErr(ctx, err)
	}
	if stop {
		// Before the update: every rank of the world stops here, at
		// step `step`, and none is a step ahead.
		return metrics.Record{}, 0, ErrStopped
	}
	waited += time.Since(collStart)
	prof.Lap(profile.Collectives)
	clip := optim.ClipFactor(sumSquares, t.optim.GradClip)
	if err := t.hooks.before(t.hooks.beforeUpdate, step+1); err != nil {
		return metrics.Record{}, 0, err
	}
	// The update copies the owned state into the rollback copy as it goes
	// (over the gradient where the copy shares its memory).
	keep := t.rollback.buffers(len(t.params))
	t.rollback.step = t.state.Step
	if err := t.enter(event{kind: kept}); err != nil {
		return metrics.Record{}, 0, fmt.Errorf("trainer: step %d: %w", step+1, err)
	}
	lr, err := optim.Update(t.eng, t.optim, &t.state, t.params, grad, t.decay, clip, keep)
	if err != nil {
		return metrics.Record{}, 0, fmt.Errorf("trainer: step %d: %w", step+1, err)
	}
	prof.Lap(profile.Optimizer)
	if err := t.hooks.before(t.hooks.afterUpdate, step+1); err != nil {
		return metrics.Record{}, 0, err
	}
	waited += t.collectives.spent
	return metrics.Record{Step: step + 1, Loss: loss, LR: lr, GradNorm: math.Sqrt(sumSquares),
		WorldSize: t.plan.WorldSize(), Rank: t.cfg.Worker.Rank, Round: t.cfg.Worker.RestartCount}, waited, nil
}

// complete completes the step of rec, the step's own figures, that waited
// for collectives: it stamps the record with c's clock, sets the
// collectives' timeout from the step times, writes the record, logs
// progress and calls AfterStep.
func (t *Trainer) complete(c *runClock, rec metrics.Record, waited time.Duration) error {
	now := time.Now()
	took := now.Sub(c.lastRecord)
	c.res.Steps++
	c.res.Loss = rec.Loss
	tokPerS := c.tokensPerStep / took.Seconds()
	rec.Time, rec.TokensPerS, rec.MFU = now, tokPerS, t.mfu(tokPerS)
	rec.ElapsedS, rec.Compute = now.Sub(c.start).Seconds(), took-waited
	if c.prof != nil {
		st := c.prof.EndStep(now)
		rec.Profile = &st
		c.res.Profile.Add(st)
	}
	t.stepTimes.Add(took)
	t.groups.SetTimeout(t.timeoutRule.For(t.stepTimes.Median()))
	c.lastRecord = now
	if err := t.metrics.Write(rec); err != nil {
		return fmt.Errorf("trainer: step %d: %w", rec.Step, err)
	}
	t.lastRecord = rec
	if err := t.enter(event{kind: completed, step: rec.Step}); err != nil {
		return fmt.Errorf("trainer: step %d: %w", rec.Step, err)
	}
	t.logProgress(c, rec)
	if t.cfg.AfterStep != nil {
		if err := t.cfg.AfterStep(t, rec); err != nil {
			return fmt.Errorf("trainer: after step %d: %w", rec.Step, err)
		}
	}
	return nil
}

// logProgress writes rank 0's progress line after rec's step, every
// log_every steps and at the last.
func (t *Trainer) logProgress(c *runClock, rec metrics.Record) {
	tc := t.cfg.Train.Train
	if !metrics.ShouldLog(rec.Step, tc.LogEvery, tc.Steps) {
		return
	}
	now := rec.Time
	tokPerS := c.tokensPerStep * float64(c.res.Steps-c.stepsAtLog) / now.Sub(c.lastLog).Seconds()
	p := metrics.Progress{Step: rec.Step, Steps: tc.Steps, Loss: rec.Loss, LR: rec.LR,
		TokensPerS: tokPerS, MFU: t.mfu(tokPerS),
		ETA: metrics.ETA(now.Sub(c.start), c.res.Steps, tc.Steps-rec.Step)}
	fmt.Fprintln(c.log, p.String())
	c.lastLog, c.stepsAtLog = now, c.res.Steps
}

// end finishes a Run that took every step: the Result's rate, rank 0's
// profile table, and a barrier so that every rank leaves together.
func (t *Trainer) end(ctx context.Context, c *runClock) (Result, error) {
	res := c.res
	if d := time.Since(c.start).Seconds(); res.Steps > 0 && d > 0 {
		res.TokensPerS = c.tokensPerStep * float64(res.Steps) / d
	}
	if res.Profile != nil && res.Steps > 0 {
		if err := res.Profile.WriteTable(c.log); err != nil {
			return res, fmt.Errorf("trainer: %w", err)
		}
	}
	// Every rank leaves together, so none takes another's goodbye for a
	// death while the last all-gather drains.
	if t.world != nil {
		if err := t.world.All().Barrier(); err != nil {
			if ctx.Err() != nil {
				return res, t.runErr(ctx, err)
			}
			return res, fmt.Errorf("trainer: final barrier: %w", err)
		}
	}
	return res, nil
}

// accumulate runs the forward and backward passes of this rank's micro
// batches of step, leaving in grad64 this rank's slice of their gradients'
// sum over the shard group (each unit reduced as the backward pass leaves
// it, see units.go), and returns the sum of their losses' means. The
// stream is empty when it returns, whatever the error.
func (t *Trainer) accumulate(step int, prof *profile.Timer) (float64, error) {
	tc := t.cfg.Train.Train
	window := t.cfg.Train.Model.Context + 1
	t.grads.beginStep()
	t.weights.beginStep(t.model.WeightsOrder(), t.batch.Accumulation())
	var lossSum float64
	for micro := range t.batch.Accumulation() {
		first := t.batch.MicroFirst(int64(step), t.cfg.Worker.Rank, micro)
		t.dataset.Samples(tc.Seed, first, window, t.tokens)
		prof.Lap(profile.Waiting)
		loss, err := t.model.ForwardUnits(t.weights, t.tokens)
		if err != nil {
			_ = t.stream.drain() // a collective's failure is err itself, or follows from it
			return 0, err
		}
		lossSum += float64(loss)
		t.grads.begin()
		if err := t.model.BackwardUnits(t.weights, t.grads, 1); err != nil {
			_ = t.stream.drain()
			return 0, err
		}
		prof.Lap(profile.Elementwise)
	}
	defer t.collectives.start()()
	return lossSum, t.stream.drain()
}

// openMetrics (re)opens the metrics file to append this Run's records.
func (t *Trainer) openMetrics() error {
	if err := t.closeMetrics(); err != nil {
		return err
	}
	w, err := metrics.Open(t.metricsPattern, t.cfg.Worker.Rank)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	t.metrics = w
	return nil
}

// recordMissed writes this rank's record of the step Run goes on from
// when the metrics file lacks it: a rank completes a step once it wrote
// its own record, so rank 0 can die after every other rank completed a
// step and before it wrote that step's record, and an in-place recovery
// then goes on from that step. Every rank's record of a step holds the
// world's figures (loss, learning rate, gradient norm); only the clock
// and the rank are its own. Nothing is written when this rank writes no
// file, holds no record of that step (it came from another process, or
// the recovery went back a step) or the file has it.
func (t *Trainer) recordMissed() error {
	rec := t.lastRecord
	if rec.Step == 0 || rec.Step != t.state.Step || t.metrics.LastStep() >= rec.Step {
		return nil
	}
	if err := t.metrics.Write(rec); err != nil {
		return fmt.Errorf("trainer: step %d, missed by the rank that recorded it: %w", rec.Step, err)
	}
	return nil
}

// runErr prefers ctx's error: a collective that failed because Run aborted
// the world on cancellation reports the cancellation's cause.
func (t *Trainer) runErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("trainer: stopped at step %d: %w", t.state.Step, context.Cause(ctx))
	}
	return fmt.Errorf("trainer: step %d: %w", t.state.Step+1, err)
}

// Close closes the metrics file and leaves the world (peers see a
// goodbye, not a death). It returns the first error of either.
func (t *Trainer) Close() error {
	var err error
	if t.metrics != nil {
		err = t.metrics.Close()
	}
	return errors.Join(err, t.closeWorld())
}

// closeMetrics closes the metrics file, if open.
func (t *Trainer) closeMetrics() error {
	if t.metrics == nil {
		return nil
	}
	err := t.metrics.Close()
	t.metrics = nil
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

func (t *Trainer) closeWorld() error {
	if t.world == nil {
		return nil
	}
	return t.world.Close()
}
