// Package heartbeat carries a worker's progress to its agent over a pipe,
// so the agent can tell a hung worker from a slow one without polling.
package heartbeat

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// EnvVar names the file descriptor a worker writes its heartbeats to. The
// agent sets it; a worker that never writes is never judged hung.
const EnvVar = "GORUN_HEARTBEAT_FD"

// WorkerFD is the descriptor the worker end has in the worker: the first
// of exec.Cmd.ExtraFiles.
const WorkerFD = 3

// Pipe is one worker's heartbeat channel, agent side.
type Pipe struct {
	r, w *os.File

	mu       sync.Mutex
	lastStep int
	lastBeat time.Time
	onBeat   func(Progress)
}

// NewPipe makes the pipe; give WorkerEnd to the worker as its first extra
// file and close it here once the worker started (CloseWorkerEnd).
func NewPipe() (*Pipe, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	return &Pipe{r: r, w: w, lastStep: -1}, nil
}

// WorkerEnd is the write end, for the worker.
func (p *Pipe) WorkerEnd() *os.File { return p.w }

// CloseWorkerEnd closes the agent's copy of the write end, so the read end
// sees end of file when the worker (and its children) are gone.
func (p *Pipe) CloseWorkerEnd() error { return p.w.Close() }

// Stall says a worker made no progress for too long.
type Stall struct {
	LastStep int           // the last step it reported
	Silent   time.Duration // since its last heartbeat
}

func (s Stall) String() string {
	return fmt.Sprintf("no progress for %s after step %d (heartbeat timeout)", s.Silent.Round(time.Millisecond), s.LastStep)
}

// OnBeat makes Watch call f with every heartbeat's progress, from
// Watch's goroutine, as it arrives: f must not block. Call it before
// Watch.
func (p *Pipe) OnBeat(f func(Progress)) { p.onBeat = f }

// Watch reads heartbeats until the worker's end closes or ctx ends, and
// sends one Stall when, after a first heartbeat, none arrives within
// timeout; a timeout of 0 or less never judges a stall (the beats still
// reach OnBeat). The channel closes when Watch is done. It closes the
// read end.
func (p *Pipe) Watch(ctx context.Context, timeout time.Duration) <-chan Stall {
	out := make(chan Stall, 1)
	beats := make(chan Progress, 16)
	go func() {
		defer close(beats)
		sc := bufio.NewScanner(p.r)
		for sc.Scan() {
			prog, err := ParseLine(sc.Text())
			if err != nil {
				continue
			}
			select {
			case beats <- prog:
			default: // the watcher is behind: a newer beat follows
			}
		}
	}()
	go func() {
		defer close(out)
		defer p.r.Close()
		var timer <-chan time.Time
		for {
			select {
			case prog, ok := <-beats:
				if !ok {
					return
				}
				p.mu.Lock()
				p.lastStep, p.lastBeat = prog.Step, time.Now()
				p.mu.Unlock()
				if p.onBeat != nil {
					p.onBeat(prog)
				}
				if timeout > 0 {
					timer = time.After(timeout)
				}
			case <-timer:
				p.mu.Lock()
				out <- Stall{LastStep: p.lastStep, Silent: time.Since(p.lastBeat)}
				p.mu.Unlock()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Beater is the worker side: Beat after each step. A nil Beater (no agent
// listening) does nothing.
type Beater struct {
	f *os.File
}

// FromEnv returns the Beater the agent set up, or nil when there is none.
func FromEnv(lookup func(string) (string, bool)) *Beater {
	v, ok := lookup(EnvVar)
	if !ok {
		return nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 0 {
		return nil
	}
	return &Beater{f: os.NewFile(uintptr(fd), "heartbeat")}
}

// Beat reports that step is done. Errors are ignored: an agent that went
// away has its own way of stopping the worker.
func (b *Beater) Beat(step int) {
	b.Report(Unreported(step))
}

// Report reports that p.Step is done, with the figures of p that are
// set. Errors are ignored, as Beat's.
func (b *Beater) Report(p Progress) {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(p.Line())
}

// LastBeat is when the worker's last heartbeat arrived (zero before the
// first), on this host's clock.
func (p *Pipe) LastBeat() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastBeat
}
