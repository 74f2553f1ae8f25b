package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gorun/gorun/internal/broadcast"
	"github.com/gorun/gorun/internal/distenv"
)

// ErrNewRound is the cause of a phase's context that a new round's
// contract ended (Follower.Enter): the worker's world is over, and the
// contract waits in Follower.Leave.
var ErrNewRound = errors.New("heartbeat: the agent started a new round")

// ErrAgentGone is Follower.Await's error when the agent's end of the
// channel closed (or Follow's context ended): no contract will come.
var ErrAgentGone = errors.New("heartbeat: the agent closed the channel")

// Phase is where a worker kept across rounds stands, as its Follower
// sees it; it says what a contract arriving from the agent does.
type Phase int

// The phases. A worker goes Idle -> Training or Reforming -> Idle (Enter,
// Leave) and Idle -> Awaiting -> Idle (Await); no other edge is taken.
const (
	// Idle: between phases. A contract that arrives waits for the next
	// Enter (which then starts already ended) or Await.
	Idle Phase = iota
	// Training: the worker runs steps in its world. A contract that
	// arrives ends the phase's context at once, with cause ErrNewRound:
	// the round this world belongs to is over, and a collective blocked on
	// a peer that is gone must not wait for it.
	Training
	// Reforming: the worker joins the next round's world. A newer
	// contract ends the phase's context as in Training: that world will
	// never be whole.
	Reforming
	// Awaiting: the worker's world broke (a peer is gone) and it waits for
	// the next round's contract; one that arrives is handed to Await.
	Awaiting
)

// String names p.
func (p Phase) String() string {
	switch p {
	case Idle:
		return "idle"
	case Training:
		return "training"
	case Reforming:
		return "reforming"
	case Awaiting:
		return "awaiting"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// Follower is the worker's side of round changes: it reads the contracts
// the agent sends over the channel and acts on each according to the
// worker's Phase. Make it with Beater.Follow. Its methods are safe for
// concurrent use (the reading goroutine calls deliver).
type Follower struct {
	log func(from, to Phase, why string)

	mu      sync.Mutex
	phase   Phase
	cancel  context.CancelCauseFunc // ends the Training or Reforming phase's context; nil otherwise
	pending *distenv.Worker         // the newest contract not yet taken
	// atBoundary: pending came in Training as a next line (the world is
	// intact): the phase goes on until a step boundary (StopAsked).
	atBoundary bool
	gone       bool             // the agent's end closed: no contract will come
	arrived    broadcast.Signal // notified when a contract arrives or the agent goes
}

// Follow starts reading the agent's contracts on b (until the agent's end
// closes or ctx ends) into a Follower in phase Idle. log, if not nil, is
// told each phase change with its reason, from any goroutine; it must
// not block. A nil Beater gives a Follower that never gets a contract.
func (b *Beater) Follow(ctx context.Context, log func(from, to Phase, why string)) *Follower {
	f := &Follower{log: log}
	rounds := b.Rounds(ctx)
	if rounds == nil {
		return f
	}
	go func() {
		for c := range rounds {
			f.deliver(c)
		}
		f.agentGone()
	}()
	return f
}

// Phase is the worker's phase now.
func (f *Follower) Phase() Phase {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.phase
}

// move takes the edge from -> to, or refuses it; f.mu is held.
func (f *Follower) move(from, to Phase, why string) error {
	if f.phase != from {
		return fmt.Errorf("heartbeat: follower: %s -> %s refused: the worker is %s", from, to, f.phase)
	}
	f.phase = to
	if f.log != nil {
		f.log(from, to, why)
	}
	return nil
}

// Enter starts phase p (Training or Reforming) from Idle and returns its
// context, derived from ctx: it ends with cause ErrNewRound when a
// contract arrives before Leave, and is born ended when one arrived
// already. Whoever runs the phase makes that end unblock it (the trainer
// aborts its comm.World with the cause).
func (f *Follower) Enter(ctx context.Context, p Phase) (context.Context, error) {
	if p != Training && p != Reforming {
		return nil, fmt.Errorf("heartbeat: follower: enter %s: only training or reforming", p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.move(Idle, p, "enter"); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancelCause(ctx)
	f.cancel = cancel
	if f.pending != nil {
		f.atBoundary = false
		f.end(fmt.Sprintf("round %d had arrived already", f.pending.RestartCount))
	}
	return pctx, nil
}

// end ends the phase's context with ErrNewRound; f.mu is held. The
// phase itself lasts until Leave: the worker is still in it until what
// runs there returned.
func (f *Follower) end(why string) {
	if f.log != nil {
		f.log(f.phase, f.phase, "phase ended: "+why)
	}
	f.cancel(ErrNewRound)
}

// Leave ends the Training or Reforming phase (back to Idle) and returns
// the contract that arrived meanwhile or before, if any, taking it: the
// round to re-form in. Leave out of those phases is an error.
func (f *Follower) Leave() (*distenv.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	from := f.phase
	if from != Training && from != Reforming {
		return nil, fmt.Errorf("heartbeat: follower: leave: the worker is %s", from)
	}
	if err := f.move(from, Idle, "leave"); err != nil {
		return nil, err
	}
	f.cancel(context.Canceled) // release the context; a no-op when a contract ended it
	f.cancel = nil
	w := f.pending
	f.pending, f.atBoundary = nil, false
	return w, nil
}

// Await waits, in phase Awaiting, for the next round's contract and
// takes it: one that arrived already, else the next one. It returns
// ErrAgentGone when the agent's end closed, ctx's cause when ctx ends,
// and an error when stop closes (a stop signal with no step boundary to
// save at); the phase is Idle again when it returns.
func (f *Follower) Await(ctx context.Context, stop <-chan struct{}) (distenv.Worker, error) {
	f.mu.Lock()
	if err := f.move(Idle, Awaiting, "awaiting the next round's contract"); err != nil {
		f.mu.Unlock()
		return distenv.Worker{}, err
	}
	for {
		if w := f.pending; w != nil {
			f.pending, f.atBoundary = nil, false
			_ = f.move(Awaiting, Idle, fmt.Sprintf("round %d arrived", w.RestartCount))
			f.mu.Unlock()
			return *w, nil
		}
		if f.gone {
			_ = f.move(Awaiting, Idle, "the agent is gone")
			f.mu.Unlock()
			return distenv.Worker{}, ErrAgentGone
		}
		arrived := f.arrived.Changed()
		f.mu.Unlock()
		var err error
		select {
		case <-arrived:
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-stop:
			err = errors.New("heartbeat: follower: stopped while awaiting a round")
		}
		f.mu.Lock()
		if err != nil {
			_ = f.move(Awaiting, Idle, err.Error())
			f.mu.Unlock()
			return distenv.Worker{}, err
		}
	}
}

// Keep puts back, in phase Idle, a contract Leave handed over that the
// worker does not act on yet: the next Enter starts ended, or Await
// takes it (unless a newer one arrives first).
func (f *Follower) Keep(w distenv.Worker) error {
	f.mu.Lock()
	if f.phase != Idle {
		defer f.mu.Unlock()
		return fmt.Errorf("heartbeat: follower: keep round %d: the worker is %s", w.RestartCount, f.phase)
	}
	f.mu.Unlock()
	f.deliver(Contract{Worker: w})
	return nil
}

// StopAsked says whether a contract that came as a next line waits for
// the Training phase to reach a step boundary: the trainer then stops at
// the first boundary its world's ranks agree on (any rank asked), and
// Leave hands the contract over.
func (f *Follower) StopAsked() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.phase == Training && f.pending != nil && f.atBoundary
}

// deliver takes a contract from the agent: the newest round wins (a
// contract of an older round than the one pending is dropped), and a
// Training or Reforming phase ends, except that a next line in Training
// leaves the phase to end at a step boundary (StopAsked).
func (f *Follower) deliver(c Contract) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := c.Worker
	if f.pending != nil && f.pending.RestartCount > w.RestartCount {
		return
	}
	f.pending = &w
	f.atBoundary = c.AtBoundary && f.phase == Training
	switch {
	case f.atBoundary:
		if f.log != nil {
			f.log(f.phase, f.phase, fmt.Sprintf("round %d arrived: going into it at the next step boundary", w.RestartCount))
		}
	case f.phase == Training || f.phase == Reforming:
		f.end(fmt.Sprintf("round %d arrived", w.RestartCount))
	}
	f.wake()
}

// agentGone records that no contract will come.
func (f *Follower) agentGone() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone = true
	f.wake()
}

// wake tells a waiting Await; f.mu is held.
func (f *Follower) wake() {
	f.arrived.Notify()
}
