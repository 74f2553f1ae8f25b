package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/bench/benchproc"
	"github.com/gorun/gorun/rendezvous"
)

// The straggler runs (issue 31 item 4): one member node's workers are slowed from slowAfter
// after the start of training (stopped slowOff, continued slowOn, in turn: a tenth of their
// speed), once with --evict-stragglers=evictAfter and a spare waiting, once without eviction.
const (
	slowAfter  = 10 * time.Second
	slowOff    = 90 * time.Millisecond
	slowOn     = 10 * time.Millisecond
	evictAfter = 10 * time.Second
)

// slowdown is a node slowed in a straggler run.
type slowdown struct {
	node string
	at   time.Time
	stop func()
	// evicted is the eviction gorun status lists at the end of the run (zero: none).
	evicted rendezvous.Failure
}

// slowNode throttles the workers of a member node (found by the run id in their environment,
// under the agent's process tree) until the returned slowdown's stop is called.
func (j *job) slowNode(ctx context.Context) (*slowdown, error) {
	members := j.members(ctx)
	if len(members) == 0 {
		return nil, fmt.Errorf("%s: no member node to slow", j.name)
	}
	a := members[len(members)-1]
	ws := benchproc.WorkersOf(a.cmd.Process.Pid, j.runID)
	if len(ws) == 0 {
		return nil, fmt.Errorf("%s: %s has no worker to slow", j.name, a.name)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		signal := func(sig syscall.Signal) bool {
			alive := false
			for _, pid := range ws {
				alive = syscall.Kill(pid, sig) == nil || alive
			}
			return alive
		}
		for {
			if !signal(syscall.SIGSTOP) {
				return // the workers are gone (evicted)
			}
			select {
			case <-done:
				signal(syscall.SIGCONT)
				return
			case <-time.After(slowOff):
			}
			signal(syscall.SIGCONT)
			select {
			case <-done:
				return
			case <-time.After(slowOn):
			}
		}
	}()
	var once sync.Once
	return &slowdown{node: a.name, at: time.Now(), stop: func() { once.Do(func() { close(done); wg.Wait() }) }}, nil
}

// evictions are the evictions gorun status --json lists for the job.
func (j *job) evictions(ctx context.Context) ([]rendezvous.Failure, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, j.b.gorun, "status", "--json", "--rdzv-endpoint="+joinComma(j.b.etcd.endpoints()), "--rdzv-id="+j.runID).Output()
	if err != nil {
		return nil, fmt.Errorf("gorun status --json --rdzv-id=%s: %w", j.runID, err)
	}
	var st struct {
		Failures []rendezvous.Failure `json:"failures"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("gorun status --json --rdzv-id=%s: %w", j.runID, err)
	}
	var ev []rendezvous.Failure
	for _, f := range st.Failures {
		if f.Signal == "evicted" {
			ev = append(ev, f)
		}
	}
	return ev, nil
}

// printStragglerTable prints the two straggler runs beside the fault-free one: kept steps per
// second over the same training window, and what eviction gained.
func printStragglerTable(w io.Writer, b *bench, ref summary, off, on summary, offJob, onJob *job) {
	fmt.Fprintf(w, "\n## one node slowed to a tenth of its speed (stopped %v, continued %v, in turn) %v after the start, %v of training\n\n",
		slowOff, slowOn, slowAfter, b.duration)
	fmt.Fprintln(w, "| run | steps kept | steps kept/s | vs fault-free | median step | evicted |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	row := func(name string, s summary, ev string) {
		fmt.Fprintf(w, "| %s | %d | %.1f | %.3f | %.1f ms | %s |\n", name, s.Kept, s.Rate(), s.Rate()/ref.Rate(), ms(s.StepTime), ev)
	}
	row("fault-free", ref, "-")
	row("slowed, no eviction", off, "none")
	evicted := "none"
	if f := onJob.slow.evicted; !f.Time.IsZero() {
		evicted = fmt.Sprintf("%s, %.1f s after the slowdown began", f.Host, f.Time.Sub(onJob.slow.at).Seconds())
	}
	row(fmt.Sprintf("slowed, --evict-stragglers=%v, a spare waiting", evictAfter), on, evicted)
	fmt.Fprintf(w, "\neviction gained: %.2fx the kept steps/s of the slowed run without eviction (%.1f/s against %.1f/s)\n",
		on.Rate()/off.Rate(), on.Rate(), off.Rate())
	if f := onJob.slow.evicted; !f.Time.IsZero() {
		fmt.Fprintf(w, "eviction: %s\n", f.Error)
	}
}
