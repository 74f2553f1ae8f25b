package checkpoint

import (
	"context"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// saveTensors saves the full tensors (by name, all of shape [len]) as the step 1 checkpoint of
// a one-rank world in dir and returns its step directory.
func saveTensors(t *testing.T, dir string, tensors map[string][]float32, order ...string) string {
	t.Helper()
	var specs []spec
	for _, name := range order {
		specs = append(specs, spec{name, []int64{int64(len(tensors[name]))}})
	}
	saveWorld(t, dir, World{Replicas: 1, Shards: 1}, 1, specs, tensors, nil)
	return filepath.Join(dir, StepName(1))
}

func TestCompare(t *testing.T) {
	ref := map[string][]float32{
		"w":          {1, -2, 4, 0},
		"b":          {0, 0},
		"optim.m.w":  {0.5, 0.25, 0, 1},
		"optim.v.w":  {1e-3, 2e-3, 0, 4e-3},
		"not.optim.": {3},
	}
	order := []string{"w", "b", "optim.m.w", "optim.v.w", "not.optim."}
	with := func(name string, vals ...float32) map[string][]float32 {
		out := map[string][]float32{}
		for k, v := range ref {
			out[k] = v
		}
		out[name] = vals
		return out
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		name    string
		a       map[string][]float32
		aOrder  []string // default: order
		tol     Tolerance
		differ  []string // tensors not Close
		groupOK map[string]bool
		// far: the Report is not Close although every tensor is, or the other way round (with
		// Norm the groups decide)
		far bool
	}{
		{name: "equal", a: ref, tol: Tolerance{},
			groupOK: map[string]bool{"params": true, "optim.m": true, "optim.v": true}},
		{name: "bit difference at rtol 0", a: with("w", 1, -2, 4.000001, 0), tol: Tolerance{},
			differ: []string{"w"}, groupOK: map[string]bool{"params": false, "optim.m": true}},
		{name: "within rtol", a: with("w", 1.00005, -2, 4.0002, 0), tol: Tolerance{RTol: 1e-4}},
		{name: "outside rtol", a: with("w", 1.0001, -2, 4.0008, 0), tol: Tolerance{RTol: 1e-4}, differ: []string{"w"}},
		{name: "a zero reference needs atol", a: with("b", 1e-9, 0), tol: Tolerance{RTol: 0.5}, differ: []string{"b"}},
		{name: "within atol", a: with("b", 1e-9, -1e-9), tol: Tolerance{ATol: 1e-8}},
		{name: "atol plus rtol", a: with("w", 1.09, -2, 4, 0), tol: Tolerance{ATol: 0.05, RTol: 0.05}},
		{name: "NaN equals NaN only", a: with("w", nan, -2, 4, 0), tol: Tolerance{RTol: 1}, differ: []string{"w"}},
		{name: "infinity", a: with("w", inf, -2, 4, 0), tol: Tolerance{ATol: 1e30}, differ: []string{"w"}},
		{name: "norm mode within", a: with("w", 1, -2, 4, 1e-6), tol: Tolerance{RTol: 1e-6, Norm: true}},
		{name: "norm mode outside", a: with("w", 1, -2, 4, 1e-4), tol: Tolerance{RTol: 1e-6, Norm: true}, differ: []string{"w"},
			groupOK: map[string]bool{"params": false}},
		{name: "norm of a zero reference", a: with("b", 1e-9, 0), tol: Tolerance{RTol: 1, Norm: true}, differ: []string{"b"},
			groupOK: map[string]bool{"params": true}, far: true},
		{name: "norm of a zero reference within atol", a: with("b", 3e-9, 4e-9), tol: Tolerance{ATol: 5e-9, Norm: true}},
		{name: "noise in one tensor, group close by norm", a: with("b", 1e-6, 0), tol: Tolerance{RTol: 1e-5, Norm: true},
			differ: []string{"b"}, groupOK: map[string]bool{"params": true}, far: true},
		{name: "shape mismatch", a: with("w", 1, -2, 4), tol: Tolerance{RTol: 1}, differ: []string{"w"},
			groupOK: map[string]bool{"params": false}},
		{name: "missing tensor", a: ref, aOrder: []string{"w", "b", "optim.m.w", "not.optim."}, tol: Tolerance{RTol: 1, Norm: true},
			differ: []string{"optim.v.w"}, groupOK: map[string]bool{"optim.v": false, "optim.m": true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			aOrder := tc.aOrder
			if aOrder == nil {
				aOrder = order
			}
			a := saveTensors(t, t.TempDir(), tc.a, aOrder...)
			b := saveTensors(t, t.TempDir(), ref, order...)
			rep, err := CompareDirs(context.Background(), a, b, tc.tol)
			require.NoError(t, err)
			var differ []string
			for _, tr := range rep.Tensors {
				if !tr.Close {
					differ = append(differ, tr.Name)
				}
			}
			require.Equal(t, tc.differ, differ)
			require.Equal(t, (len(tc.differ) == 0) != tc.far, rep.Close())
			require.Len(t, rep.Tensors, 5)
			names := []string{}
			for _, g := range rep.Groups {
				names = append(names, g.Name)
			}
			require.ElementsMatch(t, []string{"params", "optim.m", "optim.v"}, names)
			for g, ok := range tc.groupOK {
				gr, found := rep.Group(g)
				require.True(t, found, g)
				require.Equal(t, ok, gr.Close, "group %s: %+v", g, gr)
			}
		})
	}
}

func TestCompareFigures(t *testing.T) {
	b := saveTensors(t, t.TempDir(), map[string][]float32{"w": {3, 0, 4}, "optim.m.w": {0, 0, 0}}, "w", "optim.m.w")
	a := saveTensors(t, t.TempDir(), map[string][]float32{"w": {3.3, 0, 4}, "optim.m.w": {0, 0, 0}}, "w", "optim.m.w")
	rep, err := CompareDirs(context.Background(), a, b, Tolerance{RTol: 0.05})
	require.NoError(t, err)
	w := rep.Tensors[0]
	require.InDelta(t, 0.3, w.MaxAbs, 1e-6)
	require.InDelta(t, 0.1, w.MaxRel, 1e-6, "relative to b")
	require.EqualValues(t, 1, w.NotClose)
	require.InDelta(t, 5, w.RefNorm, 1e-6)
	require.InDelta(t, 0.06, w.NormRel(), 1e-6)
	require.Equal(t, "params", w.Group)
	m, ok := rep.Group("optim.m")
	require.True(t, ok)
	require.Zero(t, m.NormRel(), "0/0 is 0")
	require.True(t, math.IsInf(GroupReport{DiffNorm: 1}.NormRel(), 1), "x/0 is +Inf")

	_, err = CompareDirs(context.Background(), a, b, Tolerance{RTol: -1})
	require.ErrorContains(t, err, "must be 0 or more")
	_, err = CompareDirs(context.Background(), a, b, Tolerance{ATol: math.NaN()})
	require.ErrorContains(t, err, "must be 0 or more")
}

func TestTensorGroup(t *testing.T) {
	for name, want := range map[string]string{
		"wte.weight": "params", "optim.m.wte.weight": "optim.m", "optim.v.h.0.b": "optim.v", "optim.x": "params", "optimizer.m.w": "params",
	} {
		require.Equal(t, want, TensorGroup(name), name)
	}
}

func TestResolveErrors(t *testing.T) {
	root := t.TempDir()
	missing := filepath.Join(root, "missing")
	_, err := Resolve(missing)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.EqualError(t, err, "checkpoint: "+missing+" does not exist")
	_, err = Resolve(filepath.Join(missing, StepName(5)))
	require.ErrorContains(t, err, "does not exist")

	noManifest := filepath.Join(root, StepName(5))
	require.NoError(t, os.Mkdir(noManifest, 0o755))
	_, err = Resolve(noManifest)
	require.ErrorContains(t, err, "has no "+ManifestName)
	_, err = Resolve(root)
	require.ErrorIs(t, err, ErrNoCheckpoint)
}
