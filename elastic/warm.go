package elastic

import (
	"context"
	"syscall"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/workerlog"
)

// Warm workers (Spec.Warm): a restarted PyTorch worker spends most of its
// start importing torch (1.3-2.5 s of a 4.2 s recovery on the bench's VM,
// 4.5 s on an H200 node), so the agent keeps, per local rank, a process
// of Spec.Warm started ahead of the next round that has done so and waits
// on its channel. startWorker gives it the round's environment (an exec
// line) instead of starting a fresh process. The pool is the round
// loop's: it fills before each rendezvous (the imports overlap the wait
// for the round) and again once a round's workers made their first step
// on this node (firstSnapshot), or Spec.WarmDelay after they started,
// whichever comes first, so that the imports do not slow the round's
// start; it is emptied when the agent's life ends.

// warmUp starts a warm worker for each local rank that has none (a warm
// worker that ended on its own is released and replaced). A start that
// fails is logged: those places start fresh workers, as without Spec.Warm.
func (a *Agent) warmUp() {
	if a.spec.Warm == nil {
		return
	}
	var sink *workerlog.Sink
	var started []int
	for local, w := range a.warm {
		if w != nil && !w.endedOnItsOwn() {
			continue
		}
		if w != nil {
			a.log.Warn().Int("local_rank", local).Str("result", w.process.Result().String()).Msg("a warm worker ended before a round took it: starting another")
			a.warm[local] = nil
			a.release([]*worker{w})
		}
		if sink == nil {
			var err error
			if sink, err = a.aheadSink("warm"); err != nil {
				a.log.Warn().Err(err).Msg("no warm workers: the next round starts fresh ones")
				return
			}
		}
		fresh, err := a.launch(sink, a.placeholder(local, "warm"), asWarm, nil)
		if err != nil {
			a.log.Warn().Err(err).Int("local_rank", local).Msg("no warm worker: the next round starts a fresh one")
			continue
		}
		a.warm[local] = fresh
		started = append(started, fresh.process.PID())
	}
	if len(started) > 0 {
		a.log.Info().Ints("pids", started).Msg("started warm workers for the next round")
	}
}

// takeWarm makes the warm worker of c's local rank, if there is one that
// still runs, the worker under contract c with extra variables over its
// environment (its output goes to sink from now on), and returns it; nil
// when there is none or it cannot be told (then it is stopped, and the
// caller starts a fresh worker).
func (a *Agent) takeWarm(sink *workerlog.Sink, c distenv.Worker, extra []string) *worker {
	if a.spec.Warm == nil || a.warm[c.LocalRank] == nil {
		return nil
	}
	w := a.warm[c.LocalRank]
	a.warm[c.LocalRank] = nil
	if w.endedOnItsOwn() {
		a.log.Warn().Int("local_rank", c.LocalRank).Str("result", w.process.Result().String()).Msg("the warm worker ended before its round: starting a fresh one")
		a.release([]*worker{w})
		return nil
	}
	if err := freshErrorFile(c); err != nil {
		a.discard([]*worker{w}, syscall.SIGKILL, "warm worker: "+err.Error())
		return nil
	}
	if err := w.logs.Move(sink, c.Rank, c.LocalRank); err != nil {
		a.discard([]*worker{w}, syscall.SIGKILL, "warm worker: output of rank "+err.Error())
		return nil
	}
	if err := w.heartbeat.SendExec(a.workerEnv(c, extra)); err != nil {
		sink.Vacate(c.Rank) // its output moved there, and is closed
		a.discard([]*worker{w}, syscall.SIGKILL, "warm worker: "+err.Error())
		return nil
	}
	w.started, w.startedWarm = c, true
	w.setContract(c)
	w.observe(a.spec.Observer)
	a.log.Debug().Int("rank", c.Rank).Int("pid", w.process.PID()).Msg("worker started warm")
	return w
}

// firstSnapshot returns a channel closed once this node's local rank 0
// (global rank rank) completes a snapshot it had not when firstSnapshot
// was called: its first step in the round, for a script that saves with
// the gorun package. It is never closed without Spec.Snapshots, or when
// ctx ends first.
func (a *Agent) firstSnapshot(ctx context.Context, rank int) <-chan struct{} {
	done := make(chan struct{})
	if a.spec.Snapshots == nil {
		return done
	}
	dir := a.spec.Snapshots.Dir
	f := snapshot.Follow(dir, []int{rank}, snapshot.SafetyPoll)
	p := snapshot.NewPoller(dir, rank)
	_, _, _ = p.Poll() // what is there already (a restored step) is not new
	go func() {
		defer f.Close()
		for f.Wait(ctx, false) {
			if _, ok, err := p.Poll(); err == nil && ok {
				close(done)
				return
			}
		}
	}()
	return done
}

// dropWarm stops the warm workers no round took, when the agent's life
// ends.
func (a *Agent) dropWarm() {
	var left []*worker
	for local, w := range a.warm {
		if w != nil {
			left = append(left, w)
			a.warm[local] = nil
		}
	}
	if len(left) > 0 {
		a.discard(left, syscall.SIGTERM, "no round takes the warm workers")
	}
}
