package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/recovery"
)

// Recovery is what an Exchange did.
type Recovery struct {
	// Source says where the state the ranks go on from came from.
	Source recovery.Source
	// Step is the step every rank goes on after (0 with recovery.None).
	Step int64
	// Redone is the number of completed steps thrown away: the newest step
	// a rank of the running world completed (see recovery.Decide; a stale
	// rejoiner's steps do not count) minus Step; the step in progress at
	// the failure is not counted. With recovery.None it counts from step 0:
	// a caller that resumes from the checkpoint of step c redoes c fewer.
	Redone int
	// Received is the number of bytes of state this rank received.
	Received int64
	// Took is how long the Exchange (or the whole Reform) took.
	Took time.Duration
}

// Exchange agrees with every rank of the current world on the state to
// go on from, and gives this rank its slice of it. It is collective:
// every rank calls it, ranks that just came from New too (they hold
// nothing). Every rank announces what it holds: its live state, the copy
// from before its last optimizer update (see Run) and extra, copies kept
// elsewhere (memory copies), each a recovery.Slice of any range, and the
// round whose world last set its live state. All ranks then choose the
// same step (recovery.Decide): the highest one, no later than the last
// step every rank of the running world completed, whose holdings cover
// the whole model, using extra only if the ranks' own state does not. A rank whose live state
// is from an older round than another's (it was cut off while the others
// went on without it) is not of the running world: its older step never
// pulls the others back; it takes its slice as a fresh rank does. Each rank
// copies the part of its slice it holds and receives the rest from a
// holder (chosen to spread the load), checked with a CRC-32C; a
// corrupted transfer fails the Exchange on every rank, naming the rank
// that sent it, and changes no rank's state.
//
// With no step covered (a fresh job: nobody holds anything), Source is
// recovery.None and the Trainer is as New made it: the caller resumes
// from a checkpoint. Otherwise the Trainer holds the chosen step and Run
// goes on after it. When ctx ends Exchange aborts the world (as Run
// does) and returns ctx's cause; a peer that fails makes it return an
// error naming it.
func (t *Trainer) Exchange(ctx context.Context, extra []recovery.Slice) (Recovery, error) {
	start := time.Now()
	rec, err := t.exchange(ctx, extra)
	rec.Took = time.Since(start)
	return rec, err
}

// exchange is Exchange without the clock.
func (t *Trainer) exchange(ctx context.Context, extra []recovery.Slice) (Recovery, error) {
	if t.groups == nil {
		return Recovery{}, errors.New("trainer: exchange: no world (the last Reform failed)")
	}
	for i, h := range extra {
		if err := h.Validate(); err != nil {
			return Recovery{}, fmt.Errorf("trainer: exchange: extra holding %d: %w", i, err)
		}
	}
	if t.world != nil {
		world := t.world
		stop := context.AfterFunc(ctx, func() { world.Abort(context.Cause(ctx)) })
		defer stop()
	}
	own, done, round := t.holdings()
	held := slices.Concat(own, extra)
	all, err := t.announce(recovery.Announce(int64(done), int64(round), t.lo, t.hi, own, extra))
	if err != nil {
		return Recovery{}, t.exchangeErr(ctx, err)
	}
	d := recovery.Decide(all, t.model.Layout().Size)
	if d.Source == recovery.None {
		if err := t.reset(); err != nil {
			return Recovery{}, fmt.Errorf("trainer: exchange: %w", err)
		}
		return Recovery{Source: recovery.None, Redone: d.Redone}, nil
	}
	mine, received, err := t.transfer(d, held)
	if err != nil {
		return Recovery{}, t.exchangeErr(ctx, err)
	}
	if err := t.install(mine); err != nil {
		return Recovery{}, fmt.Errorf("trainer: exchange: %w", err)
	}
	return Recovery{Source: d.Source, Step: d.Step, Redone: d.Redone, Received: received}, nil
}

// announce all-gathers every rank's announcement.
func (t *Trainer) announce(mine recovery.Announcement) ([]recovery.Announcement, error) {
	if t.world == nil {
		return []recovery.Announcement{mine}, nil
	}
	raw, err := t.world.All().AllGatherBytes(mine.Encode())
	if err != nil {
		return nil, fmt.Errorf("announce holdings: %w", err)
	}
	all := make([]recovery.Announcement, len(raw))
	for r, b := range raw {
		if all[r], err = recovery.DecodeAnnouncement(b); err != nil {
			return nil, fmt.Errorf("announce holdings: rank %d: %w", r, err)
		}
	}
	return all, nil
}

// exchangeErr prefers ctx's error, as runErr does.
func (t *Trainer) exchangeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("trainer: exchange stopped: %w", context.Cause(ctx))
	}
	return fmt.Errorf("trainer: exchange: %w", err)
}

// transfer fills this rank's new slice as d says: pieces it holds are
// copied, the others received over a group of two ranks per pair that
// exchanges anything, made in one global order (d.Pairs), each direction
// messages of at most messageElems elements with a CRC-32C (recovery.Pack).
// A checksum mismatch does not stop the transfers (so no peer waits on
// this rank); every rank then learns of it and fails alike. It returns the
// slice, of step d.Step, and the bytes of state received.
func (t *Trainer) transfer(d recovery.Decision, held []recovery.Slice) (recovery.Slice, int64, error) {
	me := t.plan.Rank
	out := recovery.Make(d.Step, t.lo, t.hi)
	for _, p := range d.Between(me, me) {
		out.Sub(p.Lo, p.Hi).CopyFrom(held[p.Offer].Sub(p.Lo, p.Hi))
	}
	var received int64
	bad := -1 // the rank whose data failed its checksum here
	for _, pair := range d.Pairs() {
		if pair[0] != me && pair[1] != me {
			continue
		}
		g, err := t.world.Group(pair[:])
		if err != nil {
			return recovery.Slice{}, 0, fmt.Errorf("pair group %v: %w", pair, err)
		}
		for root, src := range pair {
			dst := pair[1-root]
			for _, pieces := range recovery.Messages(d.Between(src, dst), t.messageElems()) {
				if src == me {
					msg := recovery.Pack(pieces, held)
					if t.hooks.corrupt != nil {
						t.hooks.corrupt(msg)
					}
					if _, err := g.BroadcastBytes(msg, root); err != nil {
						return recovery.Slice{}, 0, fmt.Errorf("send state to rank %d: %w", dst, err)
					}
					continue
				}
				msg, err := g.BroadcastBytes(nil, root)
				if err != nil {
					return recovery.Slice{}, 0, fmt.Errorf("receive state from rank %d: %w", src, err)
				}
				n, ok := recovery.Unpack(pieces, msg, out)
				if !ok {
					if bad < 0 {
						bad = src
					}
					continue
				}
				received += int64(n)
			}
		}
	}
	if err := t.agreeIntact(bad); err != nil {
		return recovery.Slice{}, 0, err
	}
	return out, received, nil
}

// messageElems is the bound on a transfer message's elements:
// recovery.MaxMessageElems unless a test set a smaller one.
func (t *Trainer) messageElems() int {
	if t.hooks.messageElems > 0 {
		return t.hooks.messageElems
	}
	return recovery.MaxMessageElems
}

// agreeIntact tells every rank whether this rank's transfers arrived
// intact (bad < 0) or which rank's did not, and fails on every rank alike
// when one did not.
func (t *Trainer) agreeIntact(bad int) error {
	if t.world == nil {
		return nil
	}
	all, err := t.world.All().AllGatherBytes(binary.LittleEndian.AppendUint64(nil, uint64(int64(bad))))
	if err != nil {
		return fmt.Errorf("agree on checksums: %w", err)
	}
	me := t.plan.Rank
	if bad >= 0 {
		return fmt.Errorf("state from rank %d fails its crc32c checksum", bad)
	}
	for r, b := range all {
		if len(b) == 8 {
			if src := int64(binary.LittleEndian.Uint64(b)); src >= 0 {
				return fmt.Errorf("state that rank %d received from rank %d fails its crc32c checksum (this rank %d)", r, src, me)
			}
		}
	}
	return nil
}

// install makes s, this rank's new slice, its owned state after s.Step
// (phase live): Run goes on from there, after gathering the full
// parameters. It keeps s's moments as its own.
func (t *Trainer) install(s recovery.Slice) error {
	if err := t.enter(event{kind: set, step: int(s.Step), round: t.cfg.Worker.RestartCount}); err != nil {
		return err
	}
	copy(t.params, s.Params)
	t.state.M, t.state.V, t.state.Step = s.M, s.V, int(s.Step)
	return nil
}

// reset makes the Trainer as New made it (phase fresh): the parameters
// from the seed, zero AdamW state at step 0, nothing held.
func (t *Trainer) reset() error {
	if err := t.enter(event{kind: emptied}); err != nil {
		return err
	}
	clear(t.params)
	model.InitRange(t.modelCfg, t.params, t.lo, t.cfg.Train.Train.Seed)
	clear(t.state.M)
	clear(t.state.V)
	t.state.Step = 0
	return nil
}
