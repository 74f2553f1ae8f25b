package trainer

import (
	"fmt"
	"time"

	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/profile"
)

// The parameters are sharded at rest (ZeRO-3): between steps each rank
// keeps only its slice [lo, hi) of the flat parameters, and the model
// reads them one unit (model.Layout.Units: the embeddings, a part of a block, ln_f)
// at a time, each unit all-gathered from the shard group while the pass
// computes with the unit before it (one unit ahead, on the stream) and
// overwritten by the unit after next. The gradients are sharded as the
// backward pass makes them (ZeRO-2): a unit's gradient is summed over the
// shard group into each rank's slice of a float64 sum while the pass
// computes the next unit. So a rank needs at once the whole of two units'
// parameters and two units' gradients, never the model's, and its slice
// of everything else; three unit buffers, taken in turn (unitBuffers),
// hold those four, because the stream runs one collective at a time: the
// gather of the next unit starts only once the last reduce-scatter has
// read its buffer, so it can gather into that very buffer. With one shard (ddp) the units are read in place and
// the gradients added into the sum of the whole, and nothing moves until
// the replicas' all-reduce at the end of the step.
//
// zero2 keeps the parameters whole (gathered once per update) and shards
// the gradients as above; zero1 keeps both whole and reduce-scatters the
// whole gradient once the backward pass is done, which moves the fewest
// messages and takes the most memory (config.ShardsParams, ShardsGrads).
//
// Every rank of the shard group gathers and reduces the same units in the
// same order (the pass's order), so the collectives pair up; each element
// of the sum is added in the order a reduce-scatter of the whole buffer
// adds it (comm.Group.ReduceScatterAddV), so the bits are those of the
// unsharded step.

// unitWeights is model.Weights over this rank's slice of the parameters.
type unitWeights struct {
	groups *hsdp.Groups
	units  []model.Unit
	owned  []float32 // this rank's slice of the flat parameters
	lo, n  int       // where owned starts, and the padded length of the flat buffer
	// whole, in the modes that keep the parameters whole (ddp, zero1,
	// zero2), is the flat buffer, owned its slice, gathered once per
	// update (refresh); nil: each unit is gathered when needed.
	whole []float32
	// bufs holds gathered units: the one the pass reads and the next,
	// gathered on stream meanwhile (shared with the gradients' blocks).
	bufs   *unitBuffers
	stream *stream
	timer  *collectiveTimer
	// schedule is the order in which the step's passes ask for units
	// (model.Layout.WeightsOrder, once per micro batch); next is the
	// index in it of the next call of Unit, ahead the gather queued for
	// the next other unit in it (nil: none yet).
	schedule []int
	next     int
	ahead    *gathering
	// reading is the gather of the unit the pass reads now (nil: none).
	reading *gathering
}

// gathering is a unit's gather, queued on the stream: into part, a
// piece of buf (nil when the unit lies in the rank's own slice).
type gathering struct {
	part []float32
	buf  *unitBuffer
	op   *streamOp
}

// newUnitWeights lays out this rank's parameters for a flat buffer of n
// elements of which it owns [lo, hi): whole, or only the slice, the
// units gathered into bufs.
func newUnitWeights(groups *hsdp.Groups, units []model.Unit, lo, hi, n int, whole bool, bufs *unitBuffers, s *stream, timer *collectiveTimer) *unitWeights {
	w := &unitWeights{groups: groups, units: units, lo: lo, n: n, bufs: bufs, stream: s, timer: timer}
	if whole {
		w.whole = make([]float32, n)
		w.owned = w.whole[lo:hi]
	} else {
		w.owned = make([]float32, hi-lo)
	}
	return w
}

// beginStep readies the weights for a step of micro batches of passes
// over a model whose passes ask for units in order (WeightsOrder).
func (w *unitWeights) beginStep(order []int, micro int) {
	w.schedule = w.schedule[:0]
	for range micro {
		w.schedule = append(w.schedule, order...)
	}
	w.release(w.reading) // what the last pass read
	w.release(w.ahead)   // a pass that failed left it queued, and drained
	w.next, w.ahead, w.reading = 0, nil, nil
}

// release gives g's buffer back, if it has one.
func (w *unitWeights) release(g *gathering) {
	if g != nil && g.buf != nil {
		w.bufs.release(g.buf, g.op)
	}
}

// Unit gives unit u: from the whole parameters; or gathered by the
// stream, and queues the gather of the next other unit the pass asks for,
// which the stream runs while the pass computes with this one. A unit
// asked for again right after itself (the tied embeddings, at the turn
// from the forward to the backward pass) is the one already gathered.
func (w *unitWeights) Unit(u int) ([]float32, error) {
	if w.whole != nil {
		return w.whole[w.units[u].Lo:w.units[u].Hi], nil
	}
	k := w.next
	if k >= len(w.schedule) || w.schedule[k] != u {
		return nil, fmt.Errorf("trainer: the model asked for unit %d as its parameter fetch #%d, the schedule has %v", u, k, w.schedule)
	}
	w.next++
	if k > 0 && w.schedule[k-1] == u {
		return w.reading.part, nil // its gather was waited for at k-1
	}
	w.release(w.reading) // the pass reads a unit only until it asks for another
	cur := w.ahead
	if cur == nil {
		cur = w.gather(k)
	}
	w.reading, w.ahead = cur, nil
	next := k + 1
	for next < len(w.schedule) && w.schedule[next] == u {
		next++
	}
	if next < len(w.schedule) {
		w.ahead = w.gather(next)
	}
	defer w.timer.start()()
	return cur.part, cur.op.wait()
}

// gather queues the gather of the k-th unit of the schedule: into a
// buffer of bufs that neither the pass nor a later collective uses, or,
// when the unit lies in this rank's slice, in place, while the other
// ranks gather it from this one.
func (w *unitWeights) gather(k int) *gathering {
	un := w.units[w.schedule[k]]
	g := &gathering{}
	if un.Lo >= w.lo && un.Hi <= w.lo+len(w.owned) {
		g.part = w.owned[un.Lo-w.lo : un.Hi-w.lo]
	} else {
		g.buf = w.bufs.forStream()
		g.part = g.buf.data[:un.Len()]
	}
	g.op = w.stream.queue(func() error { return w.groups.GatherPart(w.owned, g.part, un.Lo, w.n) })
	return g
}

// refresh brings the whole parameters up to date with every rank's slice
// after the slices changed (an update, a restore, an exchange): one
// all-gather of the whole in the shard group. Nothing when the units are
// gathered as the passes need them, or with one shard. The stream must be
// empty.
func (w *unitWeights) refresh() error {
	if w.whole == nil || w.groups.Plan().Shards == 1 {
		return nil
	}
	defer w.timer.start()()
	return w.groups.GatherPart(w.owned, w.whole, 0, w.n)
}

// unitGrads is model.Grads into this rank's slice of the step's gradient
// sum. In the modes that shard gradients it hands out a zeroed buffer per
// unit and, when the pass is done with the unit, queues its reduction on
// the stream, which runs it while the pass computes the next unit: the
// embeddings and the final layer norm have buffers of their own (the pass
// adds to the embeddings' at its start and at its end), the blocks take
// theirs from the unit buffers (see unitBuffers). A buffer is zeroed for
// its next unit once its last reduction is done. In the others (zero1)
// the pass adds into a whole gradient buffer, reduced once the pass is
// done with its last unit, the embeddings. The sum is claimed (zeroed,
// see Trainer.claimGradSum) just before the step's first reduction is
// queued, not when the step starts: it may share the rollback copy's
// memory, which the step's first collectives make dead (see rollback).
type unitGrads struct {
	groups *hsdp.Groups
	units  []model.Unit
	n      int
	sum    []float64 // this rank's slice of the step's gradient sum
	// claim readies sum for the step's first reduction; claimed says
	// this step's is done.
	claim   func() error
	claimed bool
	// whole is the whole gradient buffer (zero1), nil when sharded.
	whole []float32
	// own are the buffers of the embeddings (0) and the final unit (1);
	// ownOpen the unit each holds the gradient of (-1: none), ownReducing
	// the reduction that last read it (nil: none).
	own         [2][]float32
	ownOpen     [2]int
	ownReducing [2]*streamOp
	// blocks lend the blocks' buffers; open is the block whose gradient
	// the pass adds to, in openBuf (nil: none).
	blocks  *unitBuffers
	open    int
	openBuf *unitBuffer
	stream  *stream
	timer   *collectiveTimer
}

func newUnitGrads(groups *hsdp.Groups, units []model.Unit, n int, sum []float64, claim func() error, whole bool, blocks *unitBuffers, s *stream, timer *collectiveTimer) *unitGrads {
	g := &unitGrads{groups: groups, units: units, n: n, sum: sum, claim: claim, blocks: blocks, stream: s, timer: timer}
	if whole {
		g.whole = make([]float32, n)
	} else {
		g.own[0] = make([]float32, units[0].Len())
		g.own[1] = make([]float32, units[len(units)-1].Len())
	}
	g.begin()
	return g
}

// beginStep readies the sum for a step: claimed by its first reduction.
func (g *unitGrads) beginStep() { g.claimed = false }

// reduce queues the reduction of grads, elements [lo, lo+len(grads)) of
// the flat gradient, into the sum, claiming the sum first if this is the
// step's first.
func (g *unitGrads) reduce(grads []float32, lo int) (*streamOp, error) {
	if !g.claimed {
		if err := g.claim(); err != nil {
			return nil, err
		}
		g.claimed = true
	}
	return g.stream.queue(func() error { return g.groups.ReducePart(grads, lo, g.n, g.sum) }), nil
}

// begin readies the buffers for a backward pass: none holds a unit, and
// the whole buffer is zero.
func (g *unitGrads) begin() {
	g.ownOpen = [2]int{-1, -1}
	if g.openBuf != nil { // a pass that failed left it open
		g.blocks.release(g.openBuf, nil)
	}
	g.open, g.openBuf = -1, nil
	clear(g.whole)
}

// ownSlot is which of own unit u uses, -1 for a block.
func (g *unitGrads) ownSlot(u int) int {
	switch u {
	case 0:
		return 0
	case len(g.units) - 1:
		return 1
	}
	return -1
}

func (g *unitGrads) Grad(u int) ([]float32, error) {
	if g.whole != nil {
		return g.whole[g.units[u].Lo:g.units[u].Hi], nil
	}
	n := g.units[u].Len()
	k := g.ownSlot(u)
	if k < 0 { // a block
		switch g.open {
		case u:
		case -1:
			b, err := g.blocks.forPass(g.timer)
			if err != nil {
				return nil, err
			}
			g.open, g.openBuf = u, b
			clear(b.data[:n])
		default:
			return nil, fmt.Errorf("trainer: the model asked for the gradient of unit %d before it was done with unit %d", u, g.open)
		}
		return g.openBuf.data[:n], nil
	}
	buf := g.own[k][:n]
	if g.ownOpen[k] != u {
		if err := g.wait(g.ownReducing[k]); err != nil {
			return nil, err
		}
		clear(buf)
		g.ownOpen[k] = u
	}
	return buf, nil
}

func (g *unitGrads) Done(u int) error {
	if g.whole != nil {
		if u != 0 { // the embeddings are the last unit the pass is done with
			return nil
		}
		op, err := g.reduce(g.whole, 0)
		if err != nil {
			return err
		}
		return g.wait(op)
	}
	lo := g.units[u].Lo
	k := g.ownSlot(u)
	if k < 0 {
		if g.open != u {
			return fmt.Errorf("trainer: the model was done with unit %d, whose gradient it did not ask for", u)
		}
		op, err := g.reduce(g.openBuf.data[:g.units[u].Len()], lo)
		if err != nil {
			return err
		}
		g.blocks.release(g.openBuf, op)
		g.open, g.openBuf = -1, nil
		return nil
	}
	op, err := g.reduce(g.own[k][:g.units[u].Len()], lo)
	if err != nil {
		return err
	}
	g.ownOpen[k], g.ownReducing[k] = -1, op
	return nil
}

// wait waits for op, timed as a collective.
func (g *unitGrads) wait(op *streamOp) error {
	defer g.timer.start()()
	return op.wait()
}

// unitBuffers lends unit-sized buffers to the gathers of the parameters
// and to the backward pass's block-part gradients, in turn. A buffer is held
// from when it is lent until it is given back (the pass has asked for the
// next unit, or is done with the gradient) and, after that, still used by
// the collective it was given back with (a gather that ran, a reduction
// that may still run). The stream runs one collective at a time, in queue
// order, so a collective queued now runs after the one a buffer was given
// back with: forStream lends such a buffer first, and the pass, which
// would have to wait, gets one whose collective is done (forPass).
//
// A rank of a mode that shards the parameters needs three: the unit the
// pass reads, the next one being gathered, and the gradient the backward
// pass adds to; the reduction of the gradient before it runs in the
// buffer the next gather then takes. The other modes need two, for the
// gradients.
type unitBuffers struct {
	bufs []*unitBuffer
}

// unitBuffer is one buffer of unitBuffers.
type unitBuffer struct {
	data  []float32
	held  bool
	after *streamOp // the collective given back with, nil: none
}

// newUnitBuffersFor makes the unit buffers of a rank that gathers the
// parameters of units (sharded) or not, and adds the gradient into a
// whole buffer (wholeGrads) or unit by unit: three of the longest unit's
// length, none, or two of the longest block part's.
func newUnitBuffersFor(units []model.Unit, sharded, wholeGrads bool) *unitBuffers {
	switch {
	case sharded:
		return newUnitBuffers(3, longestUnit(units))
	case wholeGrads:
		return newUnitBuffers(0, 0)
	}
	return newUnitBuffers(2, longestUnit(units[1:len(units)-1]))
}

// newUnitBuffers makes count buffers of length elements.
func newUnitBuffers(count, length int) *unitBuffers {
	p := &unitBuffers{}
	for range count {
		p.bufs = append(p.bufs, &unitBuffer{data: make([]float32, length)})
	}
	return p
}

// forStream lends a buffer to a collective about to be queued: one whose
// collective still runs when there is one, else any that is not held. It
// panics when all are held: a bug in the count of buffers.
func (p *unitBuffers) forStream() *unitBuffer {
	var pick *unitBuffer
	for _, b := range p.bufs {
		if !b.held && (pick == nil || !b.after.finished()) {
			pick = b
		}
	}
	return p.lend(pick)
}

// forPass lends a buffer to the pass: one whose collective is done when
// there is one, else one that is not held, once its collective is done
// (waited for as a collective, on timer). It returns that collective's
// error. It panics when all are held: a bug in the count of buffers.
func (p *unitBuffers) forPass(timer *collectiveTimer) (*unitBuffer, error) {
	var pick *unitBuffer
	for _, b := range p.bufs {
		if !b.held && (pick == nil || b.after.finished()) {
			pick = b
		}
	}
	p.lend(pick)
	if !pick.after.finished() {
		defer timer.start()()
	}
	return pick, pick.after.wait()
}

func (p *unitBuffers) lend(b *unitBuffer) *unitBuffer {
	if b == nil {
		panic(fmt.Sprintf("trainer: all %d unit buffers are lent", len(p.bufs)))
	}
	b.held = true
	return b
}

// release gives b back, its data still used by after (nil: nothing).
func (p *unitBuffers) release(b *unitBuffer, after *streamOp) {
	b.held, b.after = false, after
}

// longestUnit is the length of the longest of units (0 for none).
func longestUnit(units []model.Unit) int {
	n := 0
	for _, u := range units {
		n = max(n, u.Len())
	}
	return n
}

// collectiveTimer times the collectives of a step that unitWeights and
// unitGrads run: it adds their time to spent and laps the step's profile
// as collectives. The Trainer resets it at the start of every step.
type collectiveTimer struct {
	prof  *profile.Timer // nil: no profile
	spent time.Duration
}

// start starts timing one collective; the function it returns ends it.
func (c *collectiveTimer) start() func() {
	t0 := time.Now()
	return func() {
		c.spent += time.Since(t0)
		c.prof.Lap(profile.Collectives)
	}
}
