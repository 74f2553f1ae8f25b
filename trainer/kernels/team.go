package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A team runs the parts of one parallel region on up to threads goroutines: the caller's and
// threads-1 workers'. Starting goroutines for every region costs 15-20 µs on a virtual machine
// (waking an idle CPU), as much as a small matrix product; a team's workers instead spin for
// spinFor after each region, so the next region, usually microseconds away in a training step,
// starts at once. A worker idle longer parks, and one parked for parkedFor exits; the next
// region starts it again. So a team needs no Close, and an Engine nobody uses holds no
// goroutine for long.
//
// One region runs at a time: a region started while another runs (from another goroutine, or
// from inside a part) runs its parts on goroutines of their own, as before teams existed.
type team struct {
	threads int
	busy    sync.Mutex    // held by the caller whose region has the workers
	done    chan struct{} // the last part wakes a caller that stopped spinning
	workers []worker      // a region of p parts is handed to workers[:p-1]
}

// A region is one call of run. Its parts are not bound to goroutines: the caller and the
// workers handed the region claim them one by one (claimed) until none is left, so a worker
// the operating system has not scheduled yet (the machine is busy) delays nothing, its parts
// being taken by whoever runs.
type region struct {
	part    func(g int)
	parts   int32
	claimed atomic.Int32 // parts handed out so far
	left    atomic.Int32 // parts not yet done
	waiting atomic.Bool  // the caller blocks on done
}

// worker states: spinning or running (a goroutine that watches next), parked (blocked on
// wake), gone (no goroutine).
const (
	workerGone int32 = iota
	workerSpinning
	workerParked
)

// A worker is handed each region it takes part in through next, exactly once: it takes the
// region with a swap, so a wake-up that comes late (the caller was descheduled between handing
// the region over and waking the worker, which meanwhile ran it) finds nothing and is harmless.
type worker struct {
	next  atomic.Pointer[region]
	state atomic.Int32
	wake  chan struct{} // a caller sends one token to a parked worker it claimed
}

// spinFor is how long a worker, and a caller waiting for its parts, spin before they block:
// longer than the gaps between the regions of a step, short enough that an idle Engine costs
// little CPU. parkedFor is how long a parked worker waits before it exits.
const (
	spinFor   = 500 * time.Microsecond
	parkedFor = 20 * time.Millisecond
)

func newTeam(threads int) *team {
	t := &team{threads: threads, done: make(chan struct{}, 1), workers: make([]worker, threads-1)}
	for i := range t.workers {
		t.workers[i].wake = make(chan struct{}, 1)
	}
	return t
}

// run calls part(0..parts-1), each once, on up to parts goroutines (the caller's among them),
// and returns when all have returned; parts <= t.threads.
func (t *team) run(parts int, part func(g int)) {
	if parts <= 1 {
		if parts == 1 {
			part(0)
		}
		return
	}
	if !t.busy.TryLock() {
		goroutines(parts, part)
		return
	}
	defer t.busy.Unlock()
	r := &region{part: part, parts: int32(parts)}
	r.left.Store(int32(parts))
	for g := 1; g < parts; g++ {
		w := &t.workers[g-1]
		w.next.Store(r)
		t.wakeUp(w)
	}
	t.runParts(r)
	t.wait(r)
}

// runParts claims parts of r and runs them until every part is claimed.
func (t *team) runParts(r *region) {
	for {
		g := r.claimed.Add(1) - 1
		if g >= r.parts {
			return
		}
		r.part(int(g))
		if r.left.Add(-1) == 0 && r.waiting.CompareAndSwap(true, false) {
			t.done <- struct{}{}
		}
	}
}

// wakeUp makes sure worker w will look at its next region: a spinning worker does by itself, a
// parked one is claimed and woken, a gone one gets a new goroutine.
func (t *team) wakeUp(w *worker) {
	for {
		switch w.state.Load() {
		case workerSpinning:
			return
		case workerParked:
			if w.state.CompareAndSwap(workerParked, workerSpinning) {
				w.wake <- struct{}{}
				return
			}
		case workerGone:
			if w.state.CompareAndSwap(workerGone, workerSpinning) {
				go t.work(w)
				return
			}
		}
	}
}

// work is worker w's goroutine: it takes part in every region handed to w until it has been
// idle for spinFor plus parkedFor.
func (t *team) work(w *worker) {
	for {
		if !t.spinUntil(func() bool { return w.next.Load() != nil }) && !t.park(w) {
			return
		}
		if r := w.next.Swap(nil); r != nil { // nil: a late wake-up for a region already run
			t.runParts(r)
		}
	}
}

// park blocks worker w until a caller claims it or hands it a region (true), or parkedFor
// passes (false: the worker is gone and its goroutine must return).
func (t *team) park(w *worker) bool {
	if !w.state.CompareAndSwap(workerSpinning, workerParked) {
		panic("kernels: team worker parked twice") // only the worker itself parks
	}
	if w.next.Load() != nil && w.state.CompareAndSwap(workerParked, workerSpinning) {
		return true
	}
	timer := time.NewTimer(parkedFor)
	defer timer.Stop()
	select {
	case <-w.wake:
		return true
	case <-timer.C:
		if w.state.CompareAndSwap(workerParked, workerGone) {
			return false
		}
		<-w.wake // claimed just now: its token is on the way
		return true
	}
}

// wait returns when every part of region r has returned: it spins for spinFor, then blocks
// until the last part wakes it.
func (t *team) wait(r *region) {
	if t.spinUntil(func() bool { return r.left.Load() == 0 }) {
		return
	}
	r.waiting.Store(true)
	if r.left.Load() == 0 && r.waiting.CompareAndSwap(true, false) {
		return
	}
	<-t.done
}

// spinUntil polls cond until it holds (true) or spinFor passes (false), yielding now and then
// to other goroutines (the garbage collector's among them) and to other threads and processes
// (yieldCPU), so that spinning on a busy machine takes little from the work that runs there.
func (t *team) spinUntil(cond func() bool) bool {
	var deadline time.Time
	for i := 0; ; i++ {
		if cond() {
			return true
		}
		if i%256 == 255 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(spinFor)
			} else if now.After(deadline) {
				return false
			}
			runtime.Gosched()
			yieldCPU()
		}
	}
}

// goroutines runs part(0..parts-1) on a goroutine each, part 0 on the caller's, and returns when
// all have returned.
func goroutines(parts int, part func(g int)) {
	var wg sync.WaitGroup
	for g := 1; g < parts; g++ {
		wg.Go(func() { part(g) })
	}
	part(0)
	wg.Wait()
}
