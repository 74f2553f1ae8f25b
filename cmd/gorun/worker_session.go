package main

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
	"github.com/gorun/gorun/trainer/resume"
)

// errNewRound stops Run at a step boundary because the agent sent this
// worker its contract in a new round (a node joined, or left while this
// rank's collectives had not noticed yet): the worker re-forms in place.
var errNewRound = errors.New("the agent started a new round")

// session is one worker process's training across the rounds of its
// job: the trainer, its checkpointer and memory copies, re-formed in
// place whenever the agent sends a new round's contract instead of
// restarting the process.
type session struct {
	ctx    context.Context
	cfg    config.Config
	worker distenv.Worker
	log    io.Writer // rank 0's lines (the worker's stdout)
	stop   *resume.Stop
	term   <-chan struct{} // closed by a SIGTERM that asks for a save at the next step boundary

	t       *trainer.Trainer
	ck      *resume.Checkpointer
	keeper  *memcopy.Keeper // nil unless [checkpoint] memory and several nodes
	beat    *heartbeat.Beater
	rounds  <-chan distenv.Worker // the agent's new contracts; nil without an agent channel
	pending *distenv.Worker       // a contract that arrived during a step
	// waitRound bounds how long a worker whose world broke waits for the
	// agent's next round before it fails with the peer's error.
	waitRound time.Duration
	// redone is the steps the last recovery threw away, for the next
	// heartbeat to tell the agent (which records it for gorun status);
	// NaN once told.
	redone float64
}

// afterStep is the trainer's AfterStep hook: heartbeat, memory copy,
// checkpoint, and a stop at this boundary if a new round is pending.
func (s *session) afterStep(t *trainer.Trainer, rec metrics.Record) error {
	s.beat.Report(progressOf(rec, s.worker.RestartCount, s.redone))
	s.redone = math.NaN()
	if s.keeper != nil && rec.Step%s.cfg.Checkpoint.MemoryEvery == 0 {
		st := t.State()
		if err := s.keeper.Snapshot(memcopy.Copy{Step: st.Step, Lo: st.Lo, Hi: st.Hi, Params: st.Params, M: st.M, V: st.V}); err != nil {
			return err
		}
	}
	if err := s.ck.AfterStep(s.ctx, rec); err != nil {
		return err
	}
	select {
	case w, ok := <-s.rounds:
		if ok {
			s.pending = &w
			return errNewRound
		}
		s.rounds = nil
	default:
	}
	return nil
}

// start makes the first round's trainer state: from live peers when a
// job is re-forming around this fresh worker, else from the newest
// checkpoint (or the seed).
//
// The collectives come in the order of a re-form (exchange, then the
// checkpointer's and memory copies' groups), so that fresh workers and
// re-forming survivors meet in the same ones.
func (s *session) start() error {
	rec, err := s.t.Exchange(s.ctx, nil)
	if err != nil {
		return err
	}
	if err := s.attach(); err != nil {
		return err
	}
	return s.resumeFrom(rec, "started")
}

// attach makes the checkpointer and memory copies on the trainer's
// current world, in the same order on every rank.
func (s *session) attach() error {
	ck, err := resume.New(s.t, resume.Config{Train: s.cfg, Log: s.log, Stop: s.stop})
	if err != nil {
		return err
	}
	s.ck = ck
	if s.cfg.Checkpoint.Memory && s.t.World() != nil && s.t.Plan().WorldSize() > s.worker.LocalWorldSize {
		if s.keeper, err = memcopy.New(s.t.World(), s.worker.LocalWorldSize); err != nil {
			return err
		}
	}
	return nil
}

// detach closes the checkpointer and memory copies of the old world and
// returns the memory copies to re-form from.
func (s *session) detach() ([]trainer.Holding, error) {
	var extra []trainer.Holding
	var errs []error
	if s.keeper != nil {
		for _, c := range s.keeper.Copies() {
			extra = append(extra, trainer.Holding{Step: c.Step, Lo: c.Lo, Hi: c.Hi, Params: c.Params, M: c.M, V: c.V})
		}
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
	if rec.Source == trainer.RecoveryNone {
		_, err := s.ck.Resume(s.ctx)
		s.redone = float64(max(0, rec.Redone-s.t.Step()))
		return err
	}
	s.redone = float64(rec.Redone)
	if s.t.Plan().Rank == 0 {
		fmt.Fprintf(s.log, "trainer: %s in place at world size %d: state of step %d from %s (%d bytes received here, %d step(s) redone) in %v\n",
			what, s.t.Plan().WorldSize(), rec.Step, rec.Source, rec.Received, rec.Redone, rec.Took.Round(time.Millisecond))
	}
	return nil
}

// run trains to the end, re-forming in place each time the agent sends
// a new round: at a step boundary when one is pending, or after the
// world broke (a peer is gone) once the agent's contract arrives.
//
// The Result is the last Run's, with Steps counting the steps of every
// Run of this process.
func (s *session) run() (trainer.Result, error) {
	steps := 0
	for {
		res, err := s.t.Run(s.ctx)
		steps += res.Steps
		res.Steps = steps
		if err == nil {
			return res, nil
		}
		next, ok := s.nextRound(err)
		if !ok {
			return res, err
		}
		extra, derr := s.detach()
		if derr != nil {
			return res, derr
		}
		rec, rerr := s.t.Reform(s.ctx, next, extra)
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

// nextRound is the contract to re-form with after Run's error err, if
// the worker is to go on: the pending one, or, when a peer broke the
// world, the next one the agent sends within waitRound.
func (s *session) nextRound(err error) (distenv.Worker, bool) {
	if errors.Is(err, errNewRound) && s.pending != nil {
		w := *s.pending
		s.pending = nil
		return w, true
	}
	var pe *comm.PeerError
	if s.rounds == nil || s.ctx.Err() != nil || !errors.As(err, &pe) {
		return distenv.Worker{}, false
	}
	s.beat.Await(s.t.Step(), pe.Rank)
	timer := time.NewTimer(s.waitRound)
	defer timer.Stop()
	select {
	case w, ok := <-s.rounds:
		return w, ok
	case <-timer.C:
	case <-s.ctx.Done():
	case <-s.term: // no step boundary to save at: stop now
	}
	return distenv.Worker{}, false
}

// close closes the checkpointer (waiting for a background save, which
// uses the world) and then the trainer.
func (s *session) close() error {
	var errs []error
	if s.keeper != nil {
		errs = append(errs, s.keeper.Close())
	}
	if s.ck != nil {
		errs = append(errs, s.ck.Close())
	}
	return errors.Join(append(errs, s.t.Close())...)
}
