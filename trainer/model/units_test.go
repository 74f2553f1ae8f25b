package model

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

func TestUnitsCoverTheLayout(t *testing.T) {
	cfg := Config{Layers: 3, DModel: 8, Heads: 2, Context: 4, Vocab: 256}
	l := NewLayout(cfg)
	for _, tc := range []struct {
		name      string
		units     []Unit
		perBlock  int
		block1    int
		lastOfFst string // the last tensor of unit 1
	}{
		{"small blocks whole (Units)", l.Units(), 1, 2, "h.0.mlp.c_proj.bias"},
		{"blocks split into parts", l.units(1), 4, 5, "h.0.attn.c_attn.bias"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			units := tc.units
			require.Len(t, units, tc.perBlock*cfg.Layers+2)
			next := 0
			for i, u := range units {
				require.Equal(t, next, u.Lo, "unit %d starts where the last one ended", i)
				require.Positive(t, u.Len(), "unit %d", i)
				next = u.Hi
			}
			require.Equal(t, l.Size, next)
			wpe, _ := l.Find("wpe.weight")
			require.Equal(t, wpe.Offset+wpe.Len(), units[0].Hi, "unit 0 is the embeddings")
			h1, _ := l.Find("h.1.ln_1.weight")
			require.Equal(t, h1.Offset, units[tc.block1].Lo, "unit %d starts block 1", tc.block1)
			last, _ := l.Find(tc.lastOfFst)
			require.Equal(t, last.Offset+last.Len(), units[1].Hi, "unit 1 ends with %s", tc.lastOfFst)
			lnf, _ := l.Find("ln_f.weight")
			require.Equal(t, lnf.Offset, units[len(units)-1].Lo, "the last unit is ln_f")
		})
	}
	units := l.units(1)
	for _, part := range []struct {
		unit        int
		first, last string
	}{
		{1, "h.0.ln_1.weight", "h.0.attn.c_attn.bias"},
		{2, "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias"},
		{3, "h.0.ln_2.weight", "h.0.mlp.c_fc.bias"},
		{4, "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"},
		{12, "h.2.mlp.c_proj.weight", "h.2.mlp.c_proj.bias"},
	} {
		first, _ := l.Find(part.first)
		last, _ := l.Find(part.last)
		require.Equal(t, Unit{first.Offset, last.Offset + last.Len()}, units[part.unit], "unit %d: %s to %s", part.unit, part.first, part.last)
	}
	require.Equal(t, l.blockLen(), units[4].Hi-units[1].Lo)
	require.LessOrEqual(t, 3*longest(units[1:len(units)-1]), l.blockLen()+6*cfg.DModel, "the longest part (ln_2 and mlp.c_fc) is about a third of a block")

	big := NewLayout(Config{Layers: 2, DModel: 320, Heads: 4, Context: 8, Vocab: 256})
	require.GreaterOrEqual(t, big.blockLen(), splitBlocksFrom)
	require.Len(t, big.Units(), 4*2+2, "Units splits a block of d_model 320")
}

// longest is the length of the longest of units.
func longest(units []Unit) int {
	n := 0
	for _, u := range units {
		n = max(n, u.Len())
	}
	return n
}

func TestInitRangeIsInitsSlice(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 8, Heads: 2, Context: 4, Vocab: 256}
	l := NewLayout(cfg)
	whole := make([]float32, l.Size)
	Init(cfg, whole, 9)
	for _, r := range []struct{ lo, hi int }{
		{0, l.Size}, {0, 1}, {3, 700}, {l.Units()[1].Lo, l.Units()[2].Hi}, {l.Size - 5, l.Size}, {l.Size - 5, l.Size + 3},
	} {
		part := make([]float32, r.hi-r.lo)
		for i := range part {
			part[i] = 42
		}
		InitRange(cfg, part, r.lo, 9)
		n := min(r.hi, l.Size) - r.lo
		require.Equal(t, whole[r.lo:r.lo+n], part[:n], "[%d, %d)", r.lo, r.hi)
		for _, v := range part[n:] {
			require.Equal(t, float32(42), v, "padding past Size untouched")
		}
	}
}

// oneUnitAtATime gives a pass each unit in a fresh copy, and scribbles over the previous one,
// so a pass that kept a unit past its next call of Unit, or wrote into Weights, would show.
type oneUnitAtATime struct {
	units  []Unit
	params []float32
	cur    []float32
	asked  []int
	failAt int // the call of Unit that fails, -1 none
}

func (w *oneUnitAtATime) Unit(u int) ([]float32, error) {
	if len(w.asked) == w.failAt {
		return nil, errors.New("peer gone")
	}
	w.asked = append(w.asked, u)
	for i := range w.cur {
		w.cur[i] = float32(len(w.asked)) * 1e9
	}
	w.cur = append([]float32(nil), w.params[w.units[u].Lo:w.units[u].Hi]...)
	return w.cur, nil
}

// unitGrads hands out a zeroed buffer per unit and adds it into sum when the unit is Done.
type unitGrads struct {
	units []Unit
	sum   []float32
	open  map[int][]float32
	done  []int
}

func (g *unitGrads) Grad(u int) ([]float32, error) {
	if b, ok := g.open[u]; ok {
		return b, nil
	}
	b := make([]float32, g.units[u].Len())
	g.open[u] = b
	return b, nil
}

func (g *unitGrads) Done(u int) error {
	for i, v := range g.open[u] {
		g.sum[g.units[u].Lo+i] += v
	}
	delete(g.open, u)
	g.done = append(g.done, u)
	return nil
}

func TestUnitPassesGiveTheFlatPassesBits(t *testing.T) {
	cfg := Config{Layers: 3, DModel: 16, Heads: 4, Context: 8, Vocab: 256}
	for _, tc := range []struct {
		name        string
		opts        []Option
		asked, done []int
		forwardAsks int
	}{
		{"blocks whole", nil,
			[]int{0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 0, 0, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1},
			[]int{4, 3, 2, 1, 0}, 15},
		{"blocks in parts", []Option{splitBlocksAt(1)},
			[]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 0, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1},
			[]int{13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(cfg, 2, kernels.New(2), tc.opts...)
			require.NoError(t, err)
			p := noisyParams(cfg, 3, 0.1)
			tok := randomTokens(m.TokensLen(), 256, 4)
			wantLoss := m.Forward(p, tok)
			want := make([]float32, len(p))
			m.Backward(p, want, 0.5)

			units := m.Units()
			w := &oneUnitAtATime{units: units, params: p, failAt: -1}
			loss, err := m.ForwardUnits(w, tok)
			require.NoError(t, err)
			require.Equal(t, wantLoss, loss)
			require.Equal(t, tc.asked[:tc.forwardAsks], w.asked, "forward order")
			g := &unitGrads{units: units, sum: make([]float32, len(p)), open: map[int][]float32{}}
			require.NoError(t, m.BackwardUnits(w, g, 0.5))
			require.Equal(t, tc.asked, w.asked, "forward then backward order")
			require.Equal(t, m.WeightsOrder(), w.asked, "WeightsOrder says it")
			require.Equal(t, tc.done, g.done, "units done last first")
			require.Empty(t, g.open)
			require.Equal(t, want, g.sum)
		})
	}
}

func TestUnitPassesReturnTheWeightsError(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 8, Heads: 2, Context: 4, Vocab: 256}
	m, err := New(cfg, 1, kernels.New(1))
	require.NoError(t, err)
	p := noisyParams(cfg, 3, 0.1)
	tok := randomTokens(m.TokensLen(), 256, 4)
	for call := range 5 {
		w := &oneUnitAtATime{units: m.Units(), params: p, failAt: call}
		_, err := m.ForwardUnits(w, tok)
		require.ErrorContains(t, err, "peer gone", "forward, call %d", call)
		require.Panics(t, func() { _ = m.BackwardUnits(w, nil, 1) }, "no backward after a failed forward")
	}
	w := &oneUnitAtATime{units: m.Units(), params: p, failAt: -1}
	_, err = m.ForwardUnits(w, tok)
	require.NoError(t, err)
	w.failAt = len(w.asked) + 2
	g := &unitGrads{units: m.Units(), sum: make([]float32, len(p)), open: map[int][]float32{}}
	require.ErrorContains(t, m.BackwardUnits(w, g, 1), "peer gone")
}
