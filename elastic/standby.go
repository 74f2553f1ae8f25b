package elastic

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/rendezvous"
)

const (
	// standbyViewTimeout bounds the wait for this node's first view of
	// the job's state, to tell whether it joins a running job.
	standbyViewTimeout = 5 * time.Second
	// standbyReadyTimeout bounds how long a hot spare's workers may take
	// to build their trainers and say so; then the agent stops them and
	// waits without workers (its round starts fresh ones, as before).
	standbyReadyTimeout = 2 * time.Minute
)

// standby makes this node a hot spare when it joins a job that runs
// without it (an agent over --nnodes MAX, a replacement node started
// after a failure): for workers kept in place (Spec.InPlace), it starts
// them before the node has a round, with a placeholder contract and
// heartbeat.StandbyEnvVar, and waits until each says it is ready (built
// its trainer: data, model, kernels) or fails. Only then does the node
// register as waiting (Rendezvous.Next), so that the round that takes it
// in costs the running workers a state transfer, not a process start.
// The round adopts the workers as kept ones (their contracts over their
// channels); their state comes from their peers, as a new node's.
//
// It returns nil, and the node waits without workers as before, when
// the job is not running (a first start), the workers are not kept in
// place, or they did not start or get ready: what went wrong is logged.
func (a *Agent) standby(ctx context.Context) *keep {
	if !a.spec.InPlace {
		return nil
	}
	vctx, cancel := context.WithTimeout(ctx, standbyViewTimeout)
	runs := a.rdzv.RunsWithout(vctx)
	cancel()
	if !runs {
		return nil
	}
	start := time.Now()
	workers, err := a.startStandby()
	if err == nil {
		err = a.awaitReady(ctx, workers)
	}
	if err != nil {
		if len(workers) > 0 {
			a.discard(workers, syscall.SIGTERM, "hot spare: "+err.Error())
		}
		if ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("hot spare: the workers could not be made ready ahead of the round: waiting without them")
		}
		return nil
	}
	a.log.Info().Int("workers", len(workers)).Dur("took", time.Since(start)).
		Msg("the job runs without this node: waiting as a hot spare, its workers started and ready")
	return &keep{kind: keepSpare, workers: workers, lastStep: -1, endedAt: time.Now()}
}

// startStandby starts every local worker under its placeholder contract;
// on error it returns those it started.
func (a *Agent) startStandby() ([]*worker, error) {
	sink, err := a.aheadSink("standby")
	if err != nil {
		return nil, err
	}
	var workers []*worker
	for local := range a.spec.LocalWorkers {
		w, err := a.launch(sink, a.placeholder(local, "standby"), asStandby, nil)
		if err != nil {
			return workers, err
		}
		workers = append(workers, w)
	}
	return workers, nil
}

// placeholder is the contract of local worker `local` started ahead of
// its round (a hot spare's, a warm one): a world of this node alone, which
// the worker does not connect; its error file is under ErrorDir/kind,
// apart from every round's.
func (a *Agent) placeholder(local int, kind string) distenv.Worker {
	c := a.spec.Contract(rendezvous.Round{NumNodes: 1, WorldSize: a.spec.LocalWorkers, MasterAddr: "127.0.0.1", MasterPort: 1}, local)
	c.ErrorFile = filepath.Join(a.spec.ErrorDir, kind, fmt.Sprint(local), "error.json")
	return c
}

// awaitReady waits until every worker said it is ready; it fails when one
// ends or closes its channel first, after standbyReadyTimeout, or when
// ctx ends.
func (a *Agent) awaitReady(ctx context.Context, workers []*worker) error {
	timeout := time.NewTimer(standbyReadyTimeout)
	defer timeout.Stop()
	for _, w := range workers {
		select {
		case <-w.heartbeat.Ready():
		case <-w.process.Done():
			return fmt.Errorf("local rank %d ended before it was ready: %s", w.contract.LocalRank, w.process.Result())
		case <-w.heartbeat.Done():
			return fmt.Errorf("local rank %d closed its channel before it was ready", w.contract.LocalRank)
		case <-timeout.C:
			return fmt.Errorf("local rank %d not ready within %s", w.contract.LocalRank, standbyReadyTimeout)
		case <-ctx.Done():
			return errors.New("stopped while the workers got ready")
		}
	}
	return nil
}
