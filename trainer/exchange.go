package trainer

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"time"

	"github.com/gorun/gorun/trainer/model"
)

// Holding is the state of elements [Lo, Hi) of the padded flat buffer
// (see Layout) after Step optimizer steps: parameters and AdamW moments,
// Hi-Lo of each. Elements past the model's size are padding, always zero.
type Holding struct {
	Step         int64
	Lo, Hi       int
	Params, M, V []float32
}

// RecoverySource says where an Exchange found the state the ranks go on
// from.
type RecoverySource int

const (
	// RecoveryNone: no step was held in full; the Trainer is as New made
	// it, and the caller resumes from a checkpoint (or the seed).
	RecoveryNone RecoverySource = iota
	// RecoveryPeers: the ranks' own live state covered the model.
	RecoveryPeers
	// RecoveryMemory: the extra copies (memory copies) were needed.
	RecoveryMemory
)

// String names the source: none, peers or memory.
func (s RecoverySource) String() string {
	switch s {
	case RecoveryNone:
		return "none"
	case RecoveryPeers:
		return "peers"
	case RecoveryMemory:
		return "memory"
	}
	return fmt.Sprintf("RecoverySource(%d)", int(s))
}

// Recovery is what an Exchange did.
type Recovery struct {
	Source RecoverySource
	// Step is the step every rank goes on after (0 with RecoveryNone).
	Step int64
	// Redone is the number of completed steps thrown away: the newest step
	// a rank of the running world completed (see decide; a stale
	// rejoiner's steps do not count) minus Step; the step in progress at
	// the failure is not counted. With RecoveryNone it counts from step 0:
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
// elsewhere (memory copies), each a Holding of any slice, and the round
// whose world last set its live state. All ranks then choose the same
// step: the highest one, no later than the last step every rank of the
// running world completed, whose holdings cover the whole model, using
// extra only if the ranks' own state does not. A rank whose live state
// is from an older round than another's (it was cut off while the others
// went on without it) is not of the running world: its older step never
// pulls the others back; it takes its slice as a fresh rank does. Each rank
// copies the part of its slice it holds and receives the rest from a
// holder (chosen to spread the load), checked with a CRC-32C; a
// corrupted transfer fails the Exchange on every rank, naming the rank
// that sent it, and changes no rank's state.
//
// With no step covered (a fresh job: nobody holds anything), Source is
// RecoveryNone and the Trainer is as New made it: the caller resumes
// from a checkpoint. Otherwise the Trainer holds the chosen step and Run
// goes on after it. When ctx ends Exchange aborts the world (as Run
// does) and returns ctx's cause; a peer that fails makes it return an
// error naming it.
func (t *Trainer) Exchange(ctx context.Context, extra []Holding) (Recovery, error) {
	start := time.Now()
	rec, err := t.exchange(ctx, extra)
	rec.Took = time.Since(start)
	return rec, err
}

// exchange is Exchange without the clock.
func (t *Trainer) exchange(ctx context.Context, extra []Holding) (Recovery, error) {
	if t.groups == nil {
		return Recovery{}, errors.New("trainer: exchange: no world (the last Reform failed)")
	}
	for i, h := range extra {
		if err := h.check(); err != nil {
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
	mine := announcement{Done: int64(done), Round: int64(round), Lo: t.lo, Hi: t.hi}
	for i, h := range held {
		mine.Offers = append(mine.Offers, offer{Step: h.Step, Lo: h.Lo, Hi: h.Hi, Extra: i >= len(held)-len(extra)})
	}
	all, err := t.announce(mine)
	if err != nil {
		return Recovery{}, t.exchangeErr(ctx, err)
	}
	d := decide(all, t.model.Layout().Size)
	if d.Source == RecoveryNone {
		if err := t.reset(); err != nil {
			return Recovery{}, fmt.Errorf("trainer: exchange: %w", err)
		}
		return Recovery{Source: RecoveryNone, Redone: d.Redone}, nil
	}
	slice, received, err := t.transfer(d, held)
	if err != nil {
		return Recovery{}, t.exchangeErr(ctx, err)
	}
	if err := t.install(d.Step, slice); err != nil {
		return Recovery{}, fmt.Errorf("trainer: exchange: %w", err)
	}
	return Recovery{Source: d.Source, Step: d.Step, Redone: d.Redone, Received: received}, nil
}

// check reports a Holding whose slices do not match its range.
func (h Holding) check() error {
	n := h.Hi - h.Lo
	switch {
	case h.Step < 0:
		return fmt.Errorf("step %d", h.Step)
	case h.Lo < 0 || n < 0:
		return fmt.Errorf("range [%d, %d)", h.Lo, h.Hi)
	case len(h.Params) != n || len(h.M) != n || len(h.V) != n:
		return fmt.Errorf("range [%d, %d) with %d params, %d m, %d v", h.Lo, h.Hi, len(h.Params), len(h.M), len(h.V))
	}
	return nil
}

// announce all-gathers every rank's announcement.
func (t *Trainer) announce(mine announcement) ([]announcement, error) {
	if t.world == nil {
		return []announcement{mine}, nil
	}
	raw, err := t.world.All().AllGatherBytes(mine.encode())
	if err != nil {
		return nil, fmt.Errorf("announce holdings: %w", err)
	}
	all := make([]announcement, len(raw))
	for r, b := range raw {
		if all[r], err = decodeAnnouncement(b); err != nil {
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

// slice is this rank's new owned state, being filled.
type slice struct{ params, m, v []float32 }

// transfer fills this rank's new slice as d says: pieces it holds are
// copied, the others received over a group of two ranks per pair that
// exchanges anything, made in one global order (pairs by lowest, then
// highest rank), each direction one message with a CRC-32C. A checksum
// mismatch does not stop the transfers (so no peer waits on this rank);
// every rank then learns of it and fails alike.
func (t *Trainer) transfer(d decision, held []Holding) (slice, int64, error) {
	me, n := t.plan.Rank, t.hi-t.lo
	out := slice{params: make([]float32, n), m: make([]float32, n), v: make([]float32, n)}
	for _, p := range d.Pieces {
		if p.Dst == me && p.Src == me {
			h := held[p.Offer]
			a, b, c := p.Lo-h.Lo, p.Hi-h.Lo, p.Lo-t.lo
			copy(out.params[c:], h.Params[a:b])
			copy(out.m[c:], h.M[a:b])
			copy(out.v[c:], h.V[a:b])
		}
	}
	var received int64
	bad := -1 // the rank whose data failed its checksum here
	for _, pair := range pairsOf(d.Pieces) {
		if pair[0] != me && pair[1] != me {
			continue
		}
		g, err := t.world.Group(pair[:])
		if err != nil {
			return slice{}, 0, fmt.Errorf("pair group %v: %w", pair, err)
		}
		for root, src := range pair {
			dst := pair[1-root]
			for _, pieces := range messages(between(d.Pieces, src, dst), t.messageElems()) {
				if src == me {
					if _, err := g.BroadcastBytes(t.pack(pieces, held), root); err != nil {
						return slice{}, 0, fmt.Errorf("send state to rank %d: %w", dst, err)
					}
					continue
				}
				msg, err := g.BroadcastBytes(nil, root)
				if err != nil {
					return slice{}, 0, fmt.Errorf("receive state from rank %d: %w", src, err)
				}
				if !t.unpack(pieces, msg, out) {
					if bad < 0 {
						bad = src
					}
					continue
				}
				received += int64(len(msg) - crcLen)
			}
		}
	}
	if err := t.agreeIntact(bad); err != nil {
		return slice{}, 0, err
	}
	return out, received, nil
}

// maxMessageElems bounds the elements one transfer message carries (12
// bytes each: 96 MiB), well under comm's bound on a byte message, so that
// a slice of any size moves, and a message never needs more memory than
// that on either side.
const maxMessageElems = 8 << 20

// messageElems is the bound on a transfer message's elements:
// maxMessageElems unless a test set a smaller one.
func (t *Trainer) messageElems() int {
	if t.hooks.messageElems > 0 {
		return t.hooks.messageElems
	}
	return maxMessageElems
}

// messages splits pieces, in order, into the messages that carry them,
// each of at most limit elements; a piece that does not fit is cut where
// a message ends. Sender and receiver split alike.
func messages(pieces []piece, limit int) [][]piece {
	var out [][]piece
	var cur []piece
	room := limit
	for _, p := range pieces {
		for p.Lo < p.Hi {
			take := p
			take.Hi = min(p.Hi, p.Lo+room)
			cur = append(cur, take)
			room -= take.Hi - take.Lo
			p.Lo = take.Hi
			if room == 0 {
				out, cur, room = append(out, cur), nil, limit
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// pairsOf lists the pairs of distinct ranks that pieces move between,
// lowest rank first, in increasing order.
func pairsOf(pieces []piece) [][2]int {
	seen := map[[2]int]bool{}
	var pairs [][2]int
	for _, p := range pieces {
		if p.Src == p.Dst {
			continue
		}
		k := [2]int{min(p.Src, p.Dst), max(p.Src, p.Dst)}
		if !seen[k] {
			seen[k] = true
			pairs = append(pairs, k)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	return pairs
}

// between returns the pieces src sends dst, in order.
func between(pieces []piece, src, dst int) []piece {
	var out []piece
	for _, p := range pieces {
		if p.Src == src && p.Dst == dst {
			out = append(out, p)
		}
	}
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcLen is the length of the checksum that ends every message.
const crcLen = 4

// pack is the message that sends pieces from held: each piece's
// parameters, m and v as little-endian float32, then the CRC-32C of all
// of it.
func (t *Trainer) pack(pieces []piece, held []Holding) []byte {
	size := crcLen
	for _, p := range pieces {
		size += 12 * (p.Hi - p.Lo)
	}
	b := make([]byte, 0, size)
	for _, p := range pieces {
		h := held[p.Offer]
		a, z := p.Lo-h.Lo, p.Hi-h.Lo
		b = appendFloats(b, h.Params[a:z])
		b = appendFloats(b, h.M[a:z])
		b = appendFloats(b, h.V[a:z])
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if t.hooks.corrupt != nil {
		t.hooks.corrupt(b)
	}
	return b
}

// unpack checks msg (see pack) and copies its pieces into out; false
// when its length or checksum is wrong.
func (t *Trainer) unpack(pieces []piece, msg []byte, out slice) bool {
	size := crcLen
	for _, p := range pieces {
		size += 12 * (p.Hi - p.Lo)
	}
	if len(msg) != size {
		return false
	}
	body := msg[:size-crcLen]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(msg[size-crcLen:]) {
		return false
	}
	for _, p := range pieces {
		a, z := p.Lo-t.lo, p.Hi-t.lo
		body = readFloats(out.params[a:z], body)
		body = readFloats(out.m[a:z], body)
		body = readFloats(out.v[a:z], body)
	}
	return true
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

// install makes slice this rank's owned state after step (phase live):
// Run goes on from there, after gathering the full parameters.
func (t *Trainer) install(step int64, s slice) error {
	if err := t.enter(event{kind: set, step: int(step), round: t.cfg.Worker.RestartCount}); err != nil {
		return err
	}
	copy(t.params, s.params)
	t.state.M, t.state.V, t.state.Step = s.m, s.v, int(step)
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

// appendFloats appends the little-endian bytes of fs to b.
func appendFloats(b []byte, fs []float32) []byte {
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// readFloats fills fs from the little-endian bytes at the start of b and
// returns the rest of b, which must hold 4*len(fs) bytes.
func readFloats(fs []float32, b []byte) []byte {
	for i := range fs {
		fs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	return b
}
