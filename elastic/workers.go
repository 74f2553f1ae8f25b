package elastic

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// StackDumpGrace is how long a hung worker gets to print its stacks after
// SIGQUIT before it is killed.
const StackDumpGrace = 3 * time.Second

// worker is one running worker of a round.
type worker struct {
	contract  distenv.Worker
	process   *proc.Process
	logs      *workerlog.Worker
	heartbeat *heartbeat.Pipe                 // nil without a heartbeat timeout or an observer
	hung      atomic.Pointer[heartbeat.Stall] // its heartbeats stopped
	judged    atomic.Bool                     // the agent named it the culprit of a hang and acted on it
	suspect   atomic.Bool                     // judged, found stopped or stuck in the kernel
}

// endedOnItsOwn reports whether w's process has ended (reaped, or a
// zombie not yet reaped): called before the agent signals it, that means
// it ended for a reason of its own.
func (w *worker) endedOnItsOwn() bool {
	select {
	case <-w.process.Done():
		return true
	default:
	}
	switch procState(w.process.PID()) {
	case "Z", "X":
		return true
	}
	return procExiting(w.process.PID())
}

// pfExiting is the kernel's PF_EXITING task flag: the process is in
// exit. It is set before the process's files are closed, so a peer that
// saw its connections break (and failed for that, a victim) finds the
// cause already exiting: the order is causal, not a race with the reaper.
const pfExiting = 0x4

// procExiting reports whether process pid is exiting (PF_EXITING in the
// flags of /proc/<pid>/stat); false when it cannot be read.
func procExiting(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	// After the command: state ppid pgrp session tty_nr tpgid flags ...
	f := strings.Fields(s[i+1:])
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// procState is the one-letter state of process pid ("R", "S", "D", "T",
// ...), or "" when it cannot be read.
func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// suspectWorker is the index of a worker that is stopped (T, t) or in
// uninterruptible sleep (D): the likely cause of a hang. -1: none.
func suspectWorker(workers []*worker) int {
	for i, w := range workers {
		switch procState(w.process.PID()) {
		case "T", "t", "D":
			return i
		}
	}
	return -1
}

// longestSilent is the index of the worker whose last heartbeat is the
// oldest: in a hang with no stopped process, the likeliest culprit.
func longestSilent(workers []*worker) int {
	best := -1
	for i, w := range workers {
		if w.heartbeat == nil || w.heartbeat.LastBeat().IsZero() {
			continue
		}
		if best < 0 || w.heartbeat.LastBeat().Before(workers[best].heartbeat.LastBeat()) {
			best = i
		}
	}
	return max(best, 0)
}

func (a *Agent) startWorkers(sink *workerlog.Sink, r rendezvous.Round) ([]*worker, error) {
	var workers []*worker
	for local := 0; local < a.spec.LocalWorkers; local++ {
		c := a.spec.Contract(r, local)
		logs, err := sink.Worker(c.Rank, c.LocalRank)
		if err != nil {
			return workers, err
		}
		if err := os.MkdirAll(filepath.Dir(c.ErrorFile), 0o755); err != nil {
			logs.Close()
			return workers, fmt.Errorf("error file of rank %d: %w", c.Rank, err)
		}
		_ = os.Remove(c.ErrorFile) // a stale file would name an old error
		spec := proc.Spec{
			Path: a.spec.Command[0], Args: a.spec.Command[1:], Env: c.Environ(a.spec.Environ),
			Stdout: logs.Stdout(), Stderr: logs.Stderr(), Guard: a.spec.Guard,
		}
		var beat *heartbeat.Pipe
		if a.wantsHeartbeats() {
			if beat, err = heartbeat.NewPipe(); err != nil {
				logs.Close()
				return workers, err
			}
			spec.ExtraFiles = []*os.File{beat.WorkerEnd()}
			spec.Env = append(spec.Env, fmt.Sprintf("%s=%d", heartbeat.EnvVar, heartbeat.WorkerFD))
		}
		p, err := proc.Start(spec)
		if beat != nil {
			_ = beat.CloseWorkerEnd()
		}
		if err != nil {
			logs.Close()
			return workers, fmt.Errorf("start rank %d: %w", c.Rank, err)
		}
		a.workerPIDs.Store(p.PID(), struct{}{})
		a.spec.Observer.WorkerStarted(c)
		if beat != nil {
			beat.OnBeat(func(prog heartbeat.Progress) { a.spec.Observer.WorkerProgress(c, prog) })
		}
		a.log.Debug().Int("rank", c.Rank).Int("local_rank", local).Int("pid", p.PID()).Msg("worker started")
		workers = append(workers, &worker{contract: c, process: p, logs: logs, heartbeat: beat})
	}
	return workers, nil
}

// wantsHeartbeats says whether workers get a heartbeat pipe: to judge
// hangs, or to report their progress to an observer.
func (a *Agent) wantsHeartbeats() bool {
	return a.spec.HeartbeatTimeout > 0 || a.observed
}

// stopAll sends sig to every worker's process group, waits TermTimeout for
// them to end, then kills what is left; a second stop signal kills at
// once. It returns when every worker is reaped.
func (a *Agent) stopAll(workers []*worker, sig syscall.Signal) {
	for _, w := range workers {
		_ = w.process.Signal(sig)
	}
	allDone := make(chan struct{})
	go func() {
		for _, w := range workers {
			<-w.process.Done()
		}
		close(allDone)
	}()
	grace := time.NewTimer(a.spec.TermTimeout)
	defer grace.Stop()
	select {
	case <-allDone:
		return
	case <-grace.C:
		a.log.Warn().Dur("grace", a.spec.TermTimeout).Msg("workers still running after the grace period: SIGKILL")
	case <-a.kill:
	}
	for _, w := range workers {
		_ = w.process.Signal(syscall.SIGKILL)
	}
	<-allDone
}
