package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// module is gorun's module path; rules name our packages relative to it.
const module = "github.com/gorun/gorun"

// rule says what the packages under one of pkgs must not depend on.
type rule struct {
	name string
	// pkgs are the packages the rule holds, module-relative: "trainer"
	// is trainer and every package below it.
	pkgs []string
	// never are the packages, and the trees below them, that they must not
	// reach: module-relative for ours, whole import paths for others'.
	never []string
	// except are the packages of pkgs that the rule does not hold.
	except []string
	// direct checks only the packages' own imports, not every package
	// they link.
	direct bool
	// pending are the packages that break the rule today and are known
	// to: each must still break it, so that the list shrinks as they are
	// fixed.
	pending []string
}

// ours is every top-level directory of the module that holds packages.
var ours = []string{"bench", "checkpoint", "cmd", "elastic", "internal", "launcher", "python", "rendezvous", "slurm", "test", "trainer"}

// rules are the layering of docs/design.md ("Packages and who may import
// whom"): cmd -> launcher -> elastic -> rendezvous, launcher -> slurm,
// trainer -> checkpoint, and internal/ the ground floor under all.
var rules = []rule{
	{name: "internal imports nothing above it", pkgs: []string{"internal"},
		never: without(ours, "internal")},
	{name: "slurm is pure parsing", pkgs: []string{"slurm"}, never: without(ours, "slurm")},
	// python/ holds the worker-side Python package; its one Go package
	// only embeds those files for the agent to extract.
	{name: "python only embeds files", pkgs: []string{"python"}, never: without(ours, "python")},
	{name: "rendezvous knows no agent, launcher or trainer", pkgs: []string{"rendezvous"},
		never: []string{"elastic", "launcher", "trainer", "checkpoint", "cmd"}},
	// gorun status writes host lists in SLURM's compressed syntax
	// (slurm.CompressHostlist, a pure function); the protocol knows no SLURM.
	{name: "the round protocol knows no SLURM", pkgs: []string{"rendezvous"}, except: []string{"rendezvous/status"},
		never: []string{"slurm"}},
	{name: "elastic knows no launcher or trainer", pkgs: []string{"elastic"},
		never: []string{"launcher", "trainer", "checkpoint", "cmd", "slurm"}},
	{name: "launcher is below the commands", pkgs: []string{"launcher"}, never: []string{"cmd"}},
	{name: "the trainer bootstraps from the environment alone", pkgs: []string{"trainer"},
		never: []string{"launcher", "elastic", "rendezvous", "slurm", "cmd", "go.etcd.io"}},
	{name: "checkpoint is below the trainer", pkgs: []string{"checkpoint"},
		never: []string{"trainer", "launcher", "elastic", "rendezvous", "slurm", "cmd", "go.etcd.io"}},
	{name: "gorun-worker stays lean", pkgs: []string{"cmd/gorun-worker"},
		never: []string{"go.etcd.io", "google.golang.org/grpc", "github.com/urfave/cli", "github.com/prometheus",
			"launcher", "elastic", "rendezvous", "slurm"}},
	{name: "only rendezvous/etcd* and internal/etcdtest import etcd", pkgs: ours, direct: true,
		never:  []string{"go.etcd.io"},
		except: []string{"rendezvous/etcdstore", "rendezvous/etcdembed", "internal/etcdtest"},
		// The benchmarks drive etcd themselves.
		pending: []string{"bench/chaosbench", "bench/rdzvbench"}},
}

// without is names less drop.
func without(names []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == drop })
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// under is whether path is root or a package below it.
func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+"/")
}

// abs is a rule's name of a package as an import path: ours are
// module-relative, others' have a dot in their first element.
func abs(name string) string {
	if first, _, _ := strings.Cut(name, "/"); strings.Contains(first, ".") {
		return name
	}
	return module + "/" + name
}

// underAny is whether path is under one of the rule names roots.
func underAny(path string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return under(path, abs(r)) })
}

// check is every breach of r in pkgs, one "package -> dependency" line
// each, and the pending packages that no longer break it.
func check(r rule, pkgs []pkg) (breaches, fixed []string) {
	breaking := map[string]bool{}
	for _, p := range pkgs {
		if !underAny(p.ImportPath, r.pkgs) || slices.ContainsFunc(r.except, func(e string) bool { return p.ImportPath == abs(e) }) {
			continue
		}
		deps := p.Deps
		if r.direct {
			deps = p.Imports
		}
		for _, d := range deps {
			if !underAny(d, r.never) {
				continue
			}
			breaking[p.ImportPath] = true
			if !slices.ContainsFunc(r.pending, func(e string) bool { return p.ImportPath == abs(e) }) {
				breaches = append(breaches, strings.TrimPrefix(p.ImportPath, module+"/")+" -> "+strings.TrimPrefix(d, module+"/"))
			}
		}
	}
	for _, e := range r.pending {
		if !breaking[abs(e)] {
			fixed = append(fixed, e)
		}
	}
	return breaches, fixed
}

// list is go list's account of every package of the module (test files
// not included: tests may reach further than the code they test).
func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// The module's packages keep every rule of the design.
func TestLayering(t *testing.T) {
	pkgs := list(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			held := slices.ContainsFunc(pkgs, func(p pkg) bool { return underAny(p.ImportPath, r.pkgs) })
			require.True(t, held, "the rule holds no package: %v", r.pkgs)
			breaches, fixed := check(r, pkgs)
			require.Empty(t, breaches, "%s: these imports break it", r.name)
			require.Empty(t, fixed, "%s: these keep it now; delete them from its pending list", r.name)
		})
	}
}

// check finds a breach whether the import is direct or through another
// package, and reports a pending package that no longer breaks the rule.
func TestCheck(t *testing.T) {
	graph := []pkg{
		{ImportPath: abs("internal/a"), Imports: []string{abs("internal/b")}, Deps: []string{abs("internal/b"), abs("elastic")}},
		{ImportPath: abs("internal/b"), Imports: []string{abs("elastic")}, Deps: []string{abs("elastic")}},
		{ImportPath: abs("internal/c"), Imports: []string{"go.etcd.io/etcd/client/v3"}, Deps: []string{"go.etcd.io/etcd/client/v3"}},
		{ImportPath: abs("internalx"), Imports: []string{abs("elastic")}, Deps: []string{abs("elastic")}},
	}
	tests := []struct {
		name     string
		r        rule
		breaches []string
		fixed    []string
	}{
		{"through another package", rule{pkgs: []string{"internal"}, never: []string{"elastic"}},
			[]string{"internal/a -> elastic", "internal/b -> elastic"}, nil},
		{"direct only", rule{pkgs: []string{"internal"}, never: []string{"elastic"}, direct: true},
			[]string{"internal/b -> elastic"}, nil},
		{"a package of others", rule{pkgs: []string{"internal"}, never: []string{"go.etcd.io"}},
			[]string{"internal/c -> go.etcd.io/etcd/client/v3"}, nil},
		{"except", rule{pkgs: []string{"internal"}, never: []string{"elastic"}, except: []string{"internal/b"}},
			[]string{"internal/a -> elastic"}, nil},
		{"pending, and pending no more", rule{pkgs: []string{"internal"}, never: []string{"elastic"}, pending: []string{"internal/a", "internal/c"}},
			[]string{"internal/b -> elastic"}, []string{"internal/c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			breaches, fixed := check(tt.r, graph)
			require.Equal(t, tt.breaches, breaches, fmt.Sprint(tt.r))
			require.Equal(t, tt.fixed, fixed)
		})
	}
}
