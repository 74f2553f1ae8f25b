package trainer

import (
	"time"

	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/profile"
)

// The parameters are sharded at rest (ZeRO-3): between steps each rank
// keeps only its slice [lo, hi) of the flat parameters, and the model
// reads them one unit (model.Layout.Units: the embeddings, a block, ln_f)
// at a time, each unit all-gathered from the shard group just before the
// pass needs it and overwritten by the next. The gradients are sharded as
// the backward pass makes them (ZeRO-2): a unit's gradient is summed over
// the shard group into each rank's slice of a float64 sum as soon as the
// pass is done with it. So a rank needs at once the whole of one unit's
// parameters and one unit's gradient, never the model's, and its slice of
// everything else. With one shard (ddp) the units are read in place and
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
	// update (refresh); nil: each unit is gathered into buf when needed.
	whole []float32
	buf   []float32 // a gathered unit, as long as the longest
	timer *collectiveTimer
}

// newUnitWeights lays out this rank's parameters for a flat buffer of n
// elements of which it owns [lo, hi): whole, or only the slice with a
// buffer for one unit.
func newUnitWeights(groups *hsdp.Groups, units []model.Unit, lo, hi, n int, whole bool, timer *collectiveTimer) *unitWeights {
	w := &unitWeights{groups: groups, units: units, lo: lo, n: n, timer: timer}
	switch {
	case whole || groups.Plan().Shards == 1:
		w.whole = make([]float32, n)
		w.owned = w.whole[lo:hi]
	default:
		w.owned = make([]float32, hi-lo)
		w.buf = make([]float32, longestUnit(units))
	}
	return w
}

// Unit gives unit u: from the whole parameters; or gathered into buf;
// or, when u lies in this rank's slice, in place, while the other ranks
// gather it from this one.
func (w *unitWeights) Unit(u int) ([]float32, error) {
	un := w.units[u]
	if w.whole != nil {
		return w.whole[un.Lo:un.Hi], nil
	}
	var part []float32
	if un.Lo >= w.lo && un.Hi <= w.lo+len(w.owned) {
		part = w.owned[un.Lo-w.lo : un.Hi-w.lo]
	} else {
		part = w.buf[:un.Len()]
	}
	defer w.timer.start()()
	return part, w.groups.GatherPart(w.owned, part, un.Lo, w.n)
}

// refresh brings the whole parameters up to date with every rank's slice
// after the slices changed (an update, a restore, an exchange): one
// all-gather of the whole in the shard group. Nothing when the units are
// gathered as the passes need them, or with one shard.
func (w *unitWeights) refresh() error {
	if w.whole == nil || w.groups.Plan().Shards == 1 {
		return nil
	}
	defer w.timer.start()()
	return w.groups.GatherPart(w.owned, w.whole, 0, w.n)
}

// unitGrads is model.Grads into this rank's slice of the step's gradient
// sum. In the modes that shard gradients it hands out a zeroed buffer per
// unit and reduces it when the pass is done with the unit: the embeddings
// and the final layer norm have buffers of their own (the pass adds to the
// embeddings' at its start and at its end), the blocks share one. In the
// others (zero1, ddp) the pass adds into a whole gradient buffer, reduced
// once the pass is done with its last unit, the embeddings.
type unitGrads struct {
	groups *hsdp.Groups
	units  []model.Unit
	n      int
	sum    []float64 // this rank's slice of the step's gradient sum
	// whole is the whole gradient buffer (zero1, ddp), nil when sharded.
	whole []float32
	// bufs are the buffers of the embeddings, the final unit and the
	// blocks; open is the unit each holds the gradient of (-1: none).
	bufs  [3][]float32
	open  [3]int
	timer *collectiveTimer
}

func newUnitGrads(groups *hsdp.Groups, units []model.Unit, n int, sum []float64, whole bool, timer *collectiveTimer) *unitGrads {
	g := &unitGrads{groups: groups, units: units, n: n, sum: sum, timer: timer}
	if whole {
		g.whole = make([]float32, n)
	} else {
		last := len(units) - 1
		g.bufs[0] = make([]float32, units[0].Len())
		g.bufs[1] = make([]float32, units[last].Len())
		g.bufs[2] = make([]float32, longestUnit(units[1:last]))
	}
	g.begin()
	return g
}

// begin readies the buffers for a backward pass: none holds a unit, and
// the whole buffer is zero.
func (g *unitGrads) begin() {
	g.open = [3]int{-1, -1, -1}
	clear(g.whole)
}

// kind is which of bufs unit u uses.
func (g *unitGrads) kind(u int) int {
	switch u {
	case 0:
		return 0
	case len(g.units) - 1:
		return 1
	}
	return 2
}

func (g *unitGrads) Grad(u int) ([]float32, error) {
	if g.whole != nil {
		return g.whole[g.units[u].Lo:g.units[u].Hi], nil
	}
	k := g.kind(u)
	buf := g.bufs[k][:g.units[u].Len()]
	if g.open[k] != u {
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
		defer g.timer.start()()
		return g.groups.ReducePart(g.whole, 0, g.n, g.sum)
	}
	k := g.kind(u)
	g.open[k] = -1
	defer g.timer.start()()
	return g.groups.ReducePart(g.bufs[k][:g.units[u].Len()], g.units[u].Lo, g.n, g.sum)
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
