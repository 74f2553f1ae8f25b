package trainer

import (
	"fmt"

	"github.com/gorun/gorun/trainer/recovery"
)

// phase is where a rank stands in recovery: what it holds that an
// Exchange can use. A Trainer's phase and the data that belongs to it
// (recoveryState) change only through recoveryState.next, which takes
// the edges of this table and refuses every other:
//
//	from                    event      to       data of the new phase
//	fresh                   started    live     done: the step (0); round: the world's
//	live, updated           started    (same)   round: the world's
//	carried                 started    refused  (Reform again, or Close)
//	live, updated           kept       updated
//	fresh, carried          kept       refused
//	updated                 completed  updated  done: the step
//	fresh, live, carried    completed  refused
//	live, updated           reused     live
//	fresh, carried          reused     refused
//	any                     set        live     done: the step; round: the world's
//	any                     emptied    fresh
//	fresh                   reformed   carried  nothing carried (done -1)
//	fresh                   loaded     carried  the saved slices (done -1)
//	live, updated, carried  loaded     refused
//	live, updated           reformed   carried  the owned state (and copy), done, round
//	carried                 reformed   carried  (what it carried)
//
// Run's steps go live -> updated -> updated ..., or where the gradient
// sum shares the copy's memory live -> (reused) live -> (kept) updated
// -> (completed) updated -> (reused) live ...; an error leaves the
// phase where it was, and Reform carries it over to the next world,
// where an Exchange settles it (set or emptied). A fresh worker that
// takes over a rank's saved state (HoldSaved) carries it likewise.
type phase int

const (
	// fresh: the Trainer is as New made it (or an Exchange found no step
	// covered and reset it): the parameters from the seed at step 0,
	// nothing worth offering an exchange. The zero phase.
	fresh phase = iota
	// live: the owned state is a step of this run worth offering (Run
	// started, Restore, or an Exchange installed a step); the rollback
	// copy holds nothing.
	live
	// updated: live, and the rollback copy holds the owned state from
	// before the last optimizer update, so the rank can go back one step
	// (see rollback).
	updated
	// carried: Reform re-laid the buffers out for a new world, or a fresh
	// rank took over the state its previous process saved (HoldSaved);
	// what the rank holds is in recoveryState.carried until an Exchange
	// settles it.
	carried
)

// String names the phase as the table above does.
func (p phase) String() string {
	switch p {
	case fresh:
		return "fresh"
	case live:
		return "live"
	case updated:
		return "updated"
	case carried:
		return "carried"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// eventKind is what happened to a rank's state.
type eventKind int

const (
	// started: Run starts in the current world.
	started eventKind = iota
	// kept: a step of Run copied the owned state into the rollback copy,
	// just before its optimizer update.
	kept
	// completed: a step of Run completed: the parameters gathered again
	// and the step's record written.
	completed
	// set: Restore set the owned state, or an Exchange installed a step.
	set
	// emptied: an Exchange found no step covered and reset the Trainer
	// to the seed.
	emptied
	// reformed: Reform is about to re-lay the buffers out for a new world.
	reformed
	// reused: a step of Run is about to reduce its first gradient into
	// the rollback copy's memory, which the step's gradient sum shares
	// (see rollback): the copy holds nothing from here on.
	reused
	// loaded: a fresh rank took over the state its previous process saved
	// outside itself (HoldSaved), with no step completed.
	loaded
)

// String names the event as the table of phase does.
func (k eventKind) String() string {
	switch k {
	case started:
		return "started"
	case kept:
		return "kept"
	case completed:
		return "completed"
	case set:
		return "set"
	case emptied:
		return "emptied"
	case reformed:
		return "reformed"
	case reused:
		return "reused"
	case loaded:
		return "loaded"
	}
	return fmt.Sprintf("eventKind(%d)", int(k))
}

// event is one event with its data.
type event struct {
	kind eventKind
	// step is the step the owned state is at (started, set) or the step
	// just completed (completed).
	step int
	// round is the round (Worker.RestartCount) of the world it happens in
	// (started, set).
	round int
	// own is what the rank holds in its own buffers, read before Reform
	// replaces them (reformed): the owned state and, in phase updated,
	// the rollback copy; or what it took over (loaded).
	own []recovery.Slice
}

// recoveryState is a rank's phase and the data that belongs to it: what
// it offers an Exchange (see Trainer.holdings). The zero value is fresh.
type recoveryState struct {
	phase phase
	// done is the last step this rank completed (live, updated and
	// carried; -1 in carried when it carried nothing).
	done int
	// round is the round (Worker.RestartCount) of the world whose Run,
	// Restore or Exchange last set the live state (live, updated and
	// carried): an Exchange tells a rank that comes back from an older
	// world than the others' by it (see recovery.Decide).
	round int
	// carried is what the rank held before Reform re-laid its buffers
	// out (carried only): its live state and rollback copy, in the old
	// buffers; or the saved state it took over (loaded).
	carried []recovery.Slice
}

// next is the state e leads to from s, or an error naming the event and
// the phase when the table of phase has no such edge (s is then
// unchanged).
func (s recoveryState) next(e event) (recoveryState, error) {
	switch e.kind {
	case started:
		switch s.phase {
		case fresh:
			return recoveryState{phase: live, done: e.step, round: e.round}, nil
		case live, updated:
			s.round = e.round
			return s, nil
		}
	case kept:
		if s.phase == live || s.phase == updated {
			s.phase = updated
			return s, nil
		}
	case completed:
		if s.phase == updated {
			s.done = e.step
			return s, nil
		}
	case reused:
		if s.phase == live || s.phase == updated {
			s.phase = live
			return s, nil
		}
	case set:
		return recoveryState{phase: live, done: e.step, round: e.round}, nil
	case emptied:
		return recoveryState{}, nil
	case reformed:
		switch s.phase {
		case fresh:
			return recoveryState{phase: carried, done: -1}, nil
		case live, updated:
			return recoveryState{phase: carried, done: s.done, round: s.round, carried: e.own}, nil
		case carried:
			return s, nil
		}
	case loaded:
		if s.phase == fresh {
			return recoveryState{phase: carried, done: -1, carried: e.own}, nil
		}
	}
	return s, fmt.Errorf("%v refused in phase %v", e.kind, s.phase)
}

// enter takes event e: this rank's recovery state becomes the one e
// leads to, or stays and the error says why e is refused.
func (t *Trainer) enter(e event) error {
	next, err := t.recovery.next(e)
	if err != nil {
		return err
	}
	t.recovery = next
	return nil
}

// holdings is what this rank holds to offer an exchange, the last step it
// completed (-1: nothing) and the round whose world last set its live
// state: nothing when fresh, what it carried over a Reform, or its own
// buffers (see own).
func (t *Trainer) holdings() ([]recovery.Slice, int, int) {
	switch s := t.recovery; s.phase {
	case fresh:
		return nil, -1, 0
	case carried:
		return s.carried, s.done, s.round
	default:
		return t.own(), s.done, s.round
	}
}

// own is the state in this rank's own buffers: the owned state and, in
// phase updated, the rollback copy, unless the update it was taken for
// was not applied (the copy is then of the owned state's own step).
func (t *Trainer) own() []recovery.Slice {
	held := []recovery.Slice{{Step: int64(t.state.Step), Lo: t.lo, Hi: t.hi,
		Params: t.params, M: t.state.M, V: t.state.V}}
	if rb := &t.rollback; t.recovery.phase == updated && rb.step != t.state.Step {
		held = append(held, recovery.Slice{Step: int64(rb.step), Lo: t.lo, Hi: t.hi, Params: rb.params, M: rb.m, V: rb.v})
	}
	return held
}

// claimGradSum readies the step's gradient sum for its first reduction:
// it zeroes it and, where the sum lies in the rollback copy's memory,
// first gives the copy up (event reused; see rollback for why nothing
// can need it any more by then).
func (t *Trainer) claimGradSum() error {
	if t.rollback.inGradSum {
		if err := t.enter(event{kind: reused}); err != nil {
			return fmt.Errorf("trainer: step %d: %w", t.state.Step+1, err)
		}
	}
	zero(t.eng, t.grad64)
	return nil
}
