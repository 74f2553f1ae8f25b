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
// reads them one unit (model.Layout.Units: the embeddings, a block, ln_f)
// at a time, each unit all-gathered from the shard group while the pass
// computes with the unit before it (one unit ahead, on the stream) and
// overwritten by the unit after next. The gradients are sharded as the
// backward pass makes them (ZeRO-2): a unit's gradient is summed over the
// shard group into each rank's slice of a float64 sum while the pass
// computes the next unit. So a rank needs at once the whole of two units'
// parameters and two units' gradients, never the model's, and its slice
// of everything else. With one shard (ddp) the units are read in place and
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
	// bufs hold gathered units, each as long as the longest: the one the
	// pass reads and the next, gathered on stream meanwhile.
	bufs   [2][]float32
	stream *stream
	timer  *collectiveTimer
	// schedule is the order in which the step's passes ask for units
	// (model.Layout.WeightsOrder, once per micro batch); next is the
	// index in it of the next call of Unit, ahead the gather queued for
	// it (nil: none yet).
	schedule []int
	next     int
	ahead    *gathering
}

// gathering is a unit's gather, queued on the stream.
type gathering struct {
	part []float32
	op   *streamOp
}

// newUnitWeights lays out this rank's parameters for a flat buffer of n
// elements of which it owns [lo, hi): whole, or only the slice with
// buffers for two units.
func newUnitWeights(groups *hsdp.Groups, units []model.Unit, lo, hi, n int, whole bool, s *stream, timer *collectiveTimer) *unitWeights {
	w := &unitWeights{groups: groups, units: units, lo: lo, n: n, stream: s, timer: timer}
	switch {
	case whole || groups.Plan().Shards == 1:
		w.whole = make([]float32, n)
		w.owned = w.whole[lo:hi]
	default:
		w.owned = make([]float32, hi-lo)
		for i := range w.bufs {
			w.bufs[i] = make([]float32, longestUnit(units))
		}
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
	w.next, w.ahead = 0, nil
}

// Unit gives unit u: from the whole parameters; or gathered by the
// stream, and queues the gather of the unit the pass asks for next, which
// the stream runs while the pass computes with this one.
func (w *unitWeights) Unit(u int) ([]float32, error) {
	if w.whole != nil {
		return w.whole[w.units[u].Lo:w.units[u].Hi], nil
	}
	k := w.next
	if k >= len(w.schedule) || w.schedule[k] != u {
		return nil, fmt.Errorf("trainer: the model asked for unit %d as its parameter fetch #%d, the schedule has %v", u, k, w.schedule)
	}
	w.next++
	cur := w.ahead
	if cur == nil {
		cur = w.gather(k)
	}
	w.ahead = nil
	if k+1 < len(w.schedule) {
		w.ahead = w.gather(k + 1)
	}
	defer w.timer.start()()
	return cur.part, cur.op.wait()
}

// gather queues the gather of the k-th unit of the schedule: into
// bufs[k%2], which the pass no longer reads (it has asked for a unit
// since), or, when the unit lies in this rank's slice, in place, while the
// other ranks gather it from this one.
func (w *unitWeights) gather(k int) *gathering {
	un := w.units[w.schedule[k]]
	g := &gathering{part: w.bufs[k%2][:un.Len()]}
	if un.Lo >= w.lo && un.Hi <= w.lo+len(w.owned) {
		g.part = w.owned[un.Lo-w.lo : un.Hi-w.lo]
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
// adds to the embeddings' at its start and at its end), the blocks two,
// taken in turn. A buffer is zeroed for its next unit once its last
// reduction is done. In the others (zero1, ddp) the pass adds into a whole
// gradient buffer, reduced once the pass is done with its last unit, the
// embeddings.
type unitGrads struct {
	groups *hsdp.Groups
	units  []model.Unit
	n      int
	sum    []float64 // this rank's slice of the step's gradient sum
	// whole is the whole gradient buffer (zero1, ddp), nil when sharded.
	whole []float32
	// bufs are the buffers of the embeddings, the final unit and the
	// blocks (two); open is the unit each holds the gradient of (-1:
	// none), reducing the reduction that last read it (nil: none).
	bufs     [4][]float32
	open     [4]int
	reducing [4]*streamOp
	stream   *stream
	timer    *collectiveTimer
}

func newUnitGrads(groups *hsdp.Groups, units []model.Unit, n int, sum []float64, whole bool, s *stream, timer *collectiveTimer) *unitGrads {
	g := &unitGrads{groups: groups, units: units, n: n, sum: sum, stream: s, timer: timer}
	if whole {
		g.whole = make([]float32, n)
	} else {
		last := len(units) - 1
		g.bufs[0] = make([]float32, units[0].Len())
		g.bufs[1] = make([]float32, units[last].Len())
		g.bufs[2] = make([]float32, longestUnit(units[1:last]))
		g.bufs[3] = make([]float32, longestUnit(units[1:last]))
	}
	g.begin()
	return g
}

// begin readies the buffers for a backward pass: none holds a unit, and
// the whole buffer is zero.
func (g *unitGrads) begin() {
	g.open = [4]int{-1, -1, -1, -1}
	clear(g.whole)
}

// slot is which of bufs unit u uses.
func (g *unitGrads) slot(u int) int {
	switch u {
	case 0:
		return 0
	case len(g.units) - 1:
		return 1
	}
	return 2 + u%2
}

func (g *unitGrads) Grad(u int) ([]float32, error) {
	if g.whole != nil {
		return g.whole[g.units[u].Lo:g.units[u].Hi], nil
	}
	k := g.slot(u)
	buf := g.bufs[k][:g.units[u].Len()]
	if g.open[k] != u {
		if err := g.wait(g.reducing[k]); err != nil {
			return nil, err
		}
		clear(buf)
		g.open[k] = u
	}
	return buf, nil
}

func (g *unitGrads) Done(u int) error {
	if g.whole != nil {
		if u != 0 { // the embeddings are the last unit the pass is done with
			return nil
		}
		return g.wait(g.stream.queue(func() error { return g.groups.ReducePart(g.whole, 0, g.n, g.sum) }))
	}
	k := g.slot(u)
	g.open[k] = -1
	buf, lo := g.bufs[k][:g.units[u].Len()], g.units[u].Lo
	g.reducing[k] = g.stream.queue(func() error { return g.groups.ReducePart(buf, lo, g.n, g.sum) })
	return nil
}

// wait waits for op, timed as a collective.
func (g *unitGrads) wait(op *streamOp) error {
	defer g.timer.start()()
	return op.wait()
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
