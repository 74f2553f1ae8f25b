package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/memcopy"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/recovery"
	"github.com/gorun/gorun/trainer/resume"
)

// session is one worker process's training across the rounds of its
// job: the trainer, its checkpointer and memory copies, re-formed in
// place whenever the agent sends a new round's contract instead of
// restarting the process.
type session struct {
	ctx    context.Context
	cfg    config.Config
	worker distenv.Worker
	log    io.Writer // rank 0's lines (the worker's stdout)
	warn   io.Writer // warnings (the worker's stderr)
	stop   *resume.Stop
	term   <-chan struct{} // closed by a SIGTERM that asks for a save at the next step boundary

	t      *trainer.Trainer
	ck     *resume.Checkpointer
	keeper *memcopy.Keeper   // nil unless [checkpoint] memory and several nodes
	beat   *heartbeat.Beater // nil without an agent channel
	// follow is where the worker stands between rounds: a contract the
	// agent sends while it trains or re-forms aborts that world at once
	// (a collective blocked on a peer that is gone returns), and one it
	// awaits after its world broke is handed over.
	follow *heartbeat.Follower
	// waitRound bounds how long a worker whose world broke waits for the
	// agent's next round before it fails with the peer's error.
	waitRound time.Duration
	// redone is the steps the last recovery threw away, for the next
	// heartbeat to tell the agent (which records it for gorun status);
	// NaN once told.
	redone float64
	// stateS is the seconds the last start or recovery spent restoring
	// the state (the exchange with the peers, and a checkpoint's load),
	// for the next heartbeat likewise; NaN once told.
	stateS float64
	// snapDir is the agent's snapshot directory ("" without one) and
	// slots this rank's slots in it (nil without one).
	snapDir string
	slots   *rankSlots
}

// afterStep is the trainer's AfterStep hook: snapshot (first, see
// rankSlots), heartbeat, memory copy, checkpoint. (A new round's contract
// does not wait for a step boundary: it ends Run's context, see run.)
func (s *session) afterStep(t *trainer.Trainer, rec metrics.Record) error {
	if s.slots != nil {
		if err := s.slots.save(t); err != nil {
			return err
		}
	}
	p := progressOf(rec, s.worker.RestartCount, s.redone)
	p.StateS = s.stateS
	s.beat.Report(p)
	s.redone, s.stateS = math.NaN(), math.NaN()
	if s.keeper != nil && rec.Step%s.cfg.Checkpoint.MemoryEvery == 0 {
		if err := s.keeper.Snapshot(t.State().Slice); err != nil {
			return err
		}
	}
	return s.ck.AfterStep(s.ctx, rec)
}

// start makes the first round's trainer state: from live peers when a
// job is re-forming around this fresh worker, with the state its rank's
// previous process saved in the snapshot directory as its own (a worker
// restarted alone), else from the newest checkpoint (or the seed).
//
// The collectives come in the order of a re-form (exchange, then the
// checkpointer's and memory copies' groups), so that fresh workers and
// re-forming survivors meet in the same ones.
//
// The exchange is the follower's Reforming phase: when the agent sends a
// newer round meanwhile (a node of this one is gone), it is aborted and
// the worker re-forms in that round instead, as a rank new to the job.
func (s *session) start() error {
	if err := s.takeOver(); err != nil {
		return err
	}
	ctx, err := s.follow.Enter(s.ctx, heartbeat.Reforming)
	if err != nil {
		return err
	}
	rec, err := s.t.Exchange(ctx, nil)
	newer, lerr := s.follow.Leave()
	what := "started"
	switch {
	case lerr != nil:
		return lerr
	case err == nil && newer != nil:
		_ = s.follow.Keep(*newer) // the first Run starts ended, and re-forms
	case err != nil && newer != nil && s.ctx.Err() == nil:
		var next distenv.Worker
		if rec, next, err = s.reform(*newer, nil); err != nil {
			return fmt.Errorf("re-form in round %d: %w", next.RestartCount, err)
		}
		s.worker, what = next, fmt.Sprintf("round %d: re-formed", next.RestartCount)
	}
	if err != nil {
		return err
	}
	if err := s.attach(); err != nil {
		return err
	}
	return s.resumeFrom(rec, what)
}

// join is start for a hot spare: it tells the agent it is ready, awaits
// its first round's contract (as long as it takes: the agent ends the
// channel or the process when the job ends) and re-forms into that
// round's world, where it holds nothing and takes its slice from its
// peers, as the workers of a node that joins do.
func (s *session) join() error {
	s.beat.Ready()
	first, err := s.follow.Await(s.ctx, s.term)
	if err != nil {
		return fmt.Errorf("hot spare: awaiting a round: %w", err)
	}
	rec, next, err := s.reform(first, nil)
	if err != nil {
		return fmt.Errorf("hot spare: join round %d: %w", next.RestartCount, err)
	}
	s.worker = next
	if err := s.attach(); err != nil {
		return err
	}
	return s.resumeFrom(rec, fmt.Sprintf("round %d: joined as a hot spare", next.RestartCount))
}

// takeOver offers what this rank's previous process saved in the
// snapshot directory, if anything, to the trainer's first exchange
// (Trainer.HoldSaved).
func (s *session) takeOver() error {
	if s.snapDir == "" {
		return nil
	}
	rank := s.worker.Rank
	held, err := takeOver(s.snapDir, rank, s.t.SavedRun(), s.cfg.Train.Steps, s.warn)
	if err != nil || len(held) == 0 {
		return err
	}
	if err := s.t.HoldSaved(held); err != nil {
		return err
	}
	fmt.Fprintf(s.warn, "worker rank %d: offering the state its rank saved in %s: %s\n", rank, s.snapDir, describeSaved(held))
	return nil
}

// attach makes the checkpointer, memory copies and snapshot slots on the
// trainer's current world, in the same order on every rank.
func (s *session) attach() error {
	ck, err := resume.New(s.t, resume.Config{Train: s.cfg, Log: s.log, Stop: s.stop})
	if err != nil {
		return err
	}
	s.ck = ck
	if s.cfg.Checkpoint.Memory && s.t.World() != nil && s.t.Plan().WorldSize() > s.worker.LocalWorldSize {
		if s.keeper, err = memcopy.New(s.t.World(), s.worker.LocalWorldSize, s.cfg.Checkpoint.MemoryReplicas); err != nil {
			return err
		}
	}
	if s.snapDir != "" {
		if s.slots, err = openSlots(s.snapDir, s.worker.Rank); err != nil {
			return err
		}
	}
	return nil
}

// detach closes the checkpointer, memory copies and snapshot slots of the
// old world and returns the memory copies to re-form from.
func (s *session) detach() ([]recovery.Slice, error) {
	var extra []recovery.Slice
	errs := []error{s.slots.close()}
	s.slots = nil
	if s.keeper != nil {
		extra = s.keeper.Copies()
		errs = append(errs, s.keeper.Close())
		s.keeper = nil
	}
	if s.ck != nil {
		// A background save of the old world cannot finish without its
		// peers: its error is expected and not the worker's.
		_ = s.ck.Close()
		s.ck = nil
	}
	return extra, errors.Join(errs...)
}

// resumeFrom finishes a start or re-form: a state the exchange found
// nowhere comes from the newest checkpoint.
//
// Either way the steps the job redoes (the exchange's Redone, less the
// checkpoint's step after a resume from one) go to the agent with the
// next heartbeat: every rank computes the same, and the agent records
// them as the recovery's steps lost.
func (s *session) resumeFrom(rec trainer.Recovery, what string) error {
	if rec.Source == recovery.None {
		began := time.Now()
		_, err := s.ck.Resume(s.ctx)
		s.redone = float64(max(0, rec.Redone-s.t.Step()))
		s.stateS = (rec.Took + time.Since(began)).Seconds()
		return err
	}
	s.redone, s.stateS = float64(rec.Redone), rec.Took.Seconds()
	if s.t.Plan().Rank == 0 {
		fmt.Fprintf(s.log, "trainer: %s in place at world size %d: state of step %d from %s (%d bytes received here, %d step(s) redone) in %v\n",
			what, s.t.Plan().WorldSize(), rec.Step, rec.Source, rec.Received, rec.Redone, rec.Took.Round(time.Millisecond))
	}
	return nil
}

// run trains to the end, re-forming in place each time the agent sends
// a new round. Each Run is the follower's Training phase: a contract
// that arrives ends its context, which aborts the world, so Run returns
// at once even from a collective blocked on a peer that is gone (a node
// cut off: its lease expired and the agent formed the new round without
// it). A world that broke on its own (a peer's error) awaits the next
// contract. Each Reform is the Reforming phase: a newer contract aborts
// it, and the worker re-forms in that round instead.
//
// The Result is the last Run's, with Steps counting the steps of every
// Run of this process.
func (s *session) run() (trainer.Result, error) {
	steps := 0
	for {
		ctx, err := s.follow.Enter(s.ctx, heartbeat.Training)
		if err != nil {
			return trainer.Result{Steps: steps}, err
		}
		res, err := s.t.Run(ctx)
		pending, lerr := s.follow.Leave()
		steps += res.Steps
		res.Steps = steps
		if lerr != nil {
			return res, lerr
		}
		if err == nil {
			return res, nil
		}
		next, ok := s.nextRound(err, pending)
		if !ok {
			return res, err
		}
		extra, derr := s.detach()
		if derr != nil {
			return res, derr
		}
		rec, next, rerr := s.reform(next, extra)
		if rerr != nil {
			return res, fmt.Errorf("re-form in round %d: %w (after: %v)", next.RestartCount, rerr, err)
		}
		s.worker = next
		if err := s.attach(); err != nil {
			return res, err
		}
		if err := s.resumeFrom(rec, fmt.Sprintf("round %d: re-formed", next.RestartCount)); err != nil {
			return res, err
		}
	}
}

// reform re-forms the trainer in next's round, in the follower's
// Reforming phase; when a newer contract arrives meanwhile, that round's
// world will never be whole: it re-forms in the newer one instead. It
// returns the contract it re-formed with.
func (s *session) reform(next distenv.Worker, extra []recovery.Slice) (trainer.Recovery, distenv.Worker, error) {
	for {
		ctx, err := s.follow.Enter(s.ctx, heartbeat.Reforming)
		if err != nil {
			return trainer.Recovery{}, next, err
		}
		rec, rerr := s.t.Reform(ctx, next, extra)
		newer, lerr := s.follow.Leave()
		switch {
		case lerr != nil:
			return rec, next, lerr
		case rerr == nil:
			// A newer contract that came after the world was whole waits:
			// the next Run starts with its context ended.
			if newer != nil {
				_ = s.follow.Keep(*newer)
			}
			return rec, next, nil
		case newer == nil || s.ctx.Err() != nil:
			return rec, next, rerr
		}
		next = *newer // the Trainer kept its state: Reform again
	}
}

// nextRound is the contract to re-form with after Run's error err, if
// the worker is to go on: pending, the contract that arrived during Run
// (it aborted the world, came as the world broke, or stopped it at a step
// boundary), or, when a peer broke the world or another rank's contract
// stopped it (trainer.ErrStopped), the next one the agent sends within
// waitRound.
func (s *session) nextRound(err error, pending *distenv.Worker) (distenv.Worker, bool) {
	if s.ctx.Err() != nil {
		return distenv.Worker{}, false
	}
	var pe *comm.PeerError
	broke := errors.As(err, &pe)
	// Stopped at a step boundary for a round that adds nodes: another
	// rank's contract may have come first; this one's is on its way.
	stopped := errors.Is(err, trainer.ErrStopped)
	if pending != nil && (broke || stopped || errors.Is(err, heartbeat.ErrNewRound)) {
		return *pending, true
	}
	if s.beat == nil || !broke && !stopped {
		return distenv.Worker{}, false
	}
	if broke {
		s.beat.Await(s.t.Step(), pe.Rank)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.waitRound)
	defer cancel()
	// s.term: a SIGTERM with no step boundary to save at stops now.
	w, aerr := s.follow.Await(ctx, s.term)
	return w, aerr == nil
}

// close closes the checkpointer (waiting for a background save, which
// uses the world) and then the trainer.
func (s *session) close() error {
	errs := []error{s.slots.close()}
	if s.keeper != nil {
		errs = append(errs, s.keeper.Close())
	}
	if s.ck != nil {
		errs = append(errs, s.ck.Close())
	}
	return errors.Join(append(errs, s.t.Close())...)
}
