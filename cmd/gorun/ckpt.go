package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/checkpoint/ckptbench"
)

// ckptCommand is `gorun ckpt`: list, verify, inspect and compare distributed checkpoints.
func ckptCommand() *cli.Command {
	return &cli.Command{
		Name:  "ckpt",
		Usage: "list, verify, inspect and compare distributed sharded checkpoints",
		Subcommands: []*cli.Command{
			{
				Name:      "list",
				Usage:     "list the checkpoints of a directory, and leftovers of saves that did not commit",
				UsageText: "gorun ckpt list DIR",
				Action:    ckptList,
			},
			{
				Name:      "verify",
				Usage:     "check every checksum, and that every element of every tensor is stored exactly once; exit 1 if not",
				UsageText: "gorun ckpt verify DIR          # every checkpoint in DIR\ngorun ckpt verify DIR/step-N   # one",
				Action:    ckptVerify,
			},
			{
				Name:      "inspect",
				Usage:     "print a checkpoint's tensors, shapes, layout and sizes",
				UsageText: "gorun ckpt inspect DIR/step-N   (or DIR: the newest)",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the manifest as it is stored"}},
				Action:    ckptInspect,
			},
			{
				Name: "diff",
				Usage: "compare checkpoint A with the reference B element by element, as numpy.allclose does " +
					"(|a-b| <= atol + rtol*|b|); exit 0 only if every tensor is close (with --norm: every group)",
				UsageText: "gorun ckpt diff [--rtol=X] [--atol=Y] [--norm] A B   (each DIR/step-N, or DIR: its newest)",
				Flags: []cli.Flag{
					&cli.Float64Flag{Name: "rtol", Usage: "relative tolerance, against B's values (or B's L2 norm with --norm)"},
					&cli.Float64Flag{Name: "atol", Usage: "absolute tolerance, added to rtol*|b|"},
					&cli.BoolFlag{Name: "norm", Usage: "compare by L2 norms, ||a-b|| <= atol + rtol*||b||, per tensor and per group " +
						"(params, optim.m, optim.v: each taken as one vector), the groups deciding; the measure across world sizes"},
				},
				Action: ckptDiff,
			},
			{
				Name:   "bench",
				Usage:  "internal (bench/checkpoint.sh): time one save, one load and one async save of a synthetic state",
				Hidden: true,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dir", Required: true, Usage: "checkpoint directory (emptied first)"},
					&cli.Int64Flag{Name: "bytes", Value: 64 << 20, Usage: "state size"},
					&cli.IntFlag{Name: "ranks", Value: 1, Usage: "ranks (goroutines), each owning 1/ranks of every tensor"},
					&cli.StringFlag{Name: "fill", Value: "zero", Usage: "tensor values: zero (the bytes dd if=/dev/zero writes) or random"},
				},
				Action: ckptBench,
			},
		},
	}
}

func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", cli.Exit(fmt.Sprintf("ckpt %s: give one %s (gorun ckpt %s --help)", c.Command.Name, what, c.Command.Name), exitUsage)
	}
	return c.Args().First(), nil
}

func ckptList(c *cli.Context) error {
	dir, err := oneArg(c, "checkpoint directory")
	if err != nil {
		return err
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return cli.Exit(fmt.Sprintf("ckpt list: %s is not a directory", dir), exitUsage)
	}
	entries, err := checkpoint.List(dir)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTEP\tSTATE\tSIZE\tTENSORS\tLAYOUT\tSAVED")
	for _, e := range entries {
		size := dirSize(e.Path)
		switch {
		case e.Temp:
			fmt.Fprintf(w, "%s\t%d\tincomplete (a save that did not commit)\t%s\t\t\t\n", e.Name, e.Step, human(size))
		case !e.Complete:
			fmt.Fprintf(w, "%s\t%d\tincomplete (no manifest)\t%s\t\t\t\n", e.Name, e.Step, human(size))
		default:
			m, err := checkpoint.ReadManifest(e.Path)
			if err != nil {
				fmt.Fprintf(w, "%s\t%d\tcorrupt: %v\t%s\t\t\t\n", e.Name, e.Step, err, human(size))
				continue
			}
			fmt.Fprintf(w, "%s\t%d\tcomplete\t%s\t%d\t%s\t%s\n", e.Name, e.Step, human(size), len(m.Tensors), m.World,
				m.Created.Local().Format(time.DateTime))
		}
	}
	return w.Flush()
}

func ckptVerify(c *cli.Context) error {
	path, err := oneArg(c, "checkpoint directory or step directory")
	if err != nil {
		return err
	}
	var dirs []string
	if _, err := os.Stat(filepath.Join(path, checkpoint.ManifestName)); err == nil {
		dirs = []string{path}
	} else {
		entries, err := checkpoint.List(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Complete {
				dirs = append(dirs, e.Path)
			}
		}
		if len(dirs) == 0 {
			return cli.Exit(fmt.Sprintf("ckpt verify: no complete checkpoint in %s", path), 1)
		}
	}
	bad := 0
	for _, dir := range dirs {
		if err := verifyOne(c.Context, c.App.Writer, dir); err != nil {
			bad++
		}
	}
	if bad > 0 {
		return cli.Exit(fmt.Sprintf("ckpt verify: %d of %d checkpoints corrupt", bad, len(dirs)), 1)
	}
	return nil
}

// verifyOne prints "NAME: ok ..." or "NAME: CORRUPT" and one line per problem.
func verifyOne(ctx context.Context, out io.Writer, dir string) error {
	name := filepath.Base(dir)
	ck, err := checkpoint.Open(dir)
	if err == nil {
		err = ck.Verify(ctx)
	}
	if err != nil {
		fmt.Fprintf(out, "%s: CORRUPT\n", name)
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(out, "  %s\n", line)
		}
		if ck != nil {
			ck.Close()
		}
		return err
	}
	defer ck.Close()
	m := ck.Manifest()
	var elems, bytes int64
	for _, t := range m.Tensors {
		elems += t.Elements()
	}
	for _, f := range m.Files {
		bytes += f.Bytes
	}
	fmt.Fprintf(out, "%s: ok: %d tensors, %d elements each stored once, %d files, %s, checksums match\n",
		name, len(m.Tensors), elems, len(m.Files), human(bytes))
	return nil
}

func ckptInspect(c *cli.Context) error {
	path, err := oneArg(c, "step directory")
	if err != nil {
		return err
	}
	dir, err := checkpoint.Resolve(path)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if c.Bool("json") {
		b, err := os.ReadFile(filepath.Join(dir, checkpoint.ManifestName))
		if err != nil {
			return err
		}
		_, err = c.App.Writer.Write(b)
		return err
	}
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	out := c.App.Writer
	var total int64
	for _, f := range m.Files {
		total += f.Bytes
	}
	fmt.Fprintf(out, "checkpoint    %s\n", dir)
	fmt.Fprintf(out, "step          %d\n", m.Step)
	fmt.Fprintf(out, "sample index  %d\n", m.SampleIndex)
	fmt.Fprintf(out, "layout        %s (%d ranks)\n", m.World, m.World.Size())
	fmt.Fprintf(out, "config hash   %s\n", m.ConfigHash)
	fmt.Fprintf(out, "rng state     %d bytes\n", len(m.RNG))
	fmt.Fprintf(out, "saved         %s\n", m.Created.Local().Format(time.RFC3339))
	fmt.Fprintf(out, "format        %d, crc32c per %s block\n", m.Version, human(m.BlockBytes))
	fmt.Fprintf(out, "size          %s in %d files\n\n", human(total), len(m.Files))
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TENSOR\tDTYPE\tSHAPE\tELEMENTS\tSIZE\tCHUNKS")
	for _, t := range m.Tensors {
		fmt.Fprintf(w, "%s\t%s\t%v\t%d\t%s\t%d\n", t.Name, t.DType, t.Shape, t.Elements(), human(t.Elements()*4), len(t.Chunks))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "FILE\tRANK\tSIZE")
	for _, f := range m.Files {
		fmt.Fprintf(w, "%s\t%d\t%s\n", f.Name, f.Rank, human(f.Bytes))
	}
	return w.Flush()
}

func ckptDiff(c *cli.Context) error {
	if c.NArg() != 2 {
		return cli.Exit("ckpt diff: give two checkpoints, A and B (gorun ckpt diff --help)", exitUsage)
	}
	tol := checkpoint.Tolerance{RTol: c.Float64("rtol"), ATol: c.Float64("atol"), Norm: c.Bool("norm")}
	for _, f := range []string{"rtol", "atol"} {
		if v := c.Float64(f); v < 0 || math.IsNaN(v) {
			return cli.Exit(fmt.Sprintf("ckpt diff: --%s=%v must be 0 or more", f, v), exitUsage)
		}
	}
	var cks [2]*checkpoint.Checkpoint
	for i, p := range c.Args().Slice() {
		dir, err := checkpoint.Resolve(p)
		if err != nil {
			return cli.Exit(err.Error(), 1)
		}
		ck, err := checkpoint.Open(dir)
		if err != nil {
			return cli.Exit(fmt.Sprintf("ckpt diff: %s: %v", dir, err), 1)
		}
		defer ck.Close()
		cks[i] = ck
	}
	rep, err := checkpoint.Compare(c.Context, cks[0], cks[1], tol)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if err := printDiff(c.App.Writer, rep); err != nil {
		return err
	}
	ma, mb := cks[0].Manifest(), cks[1].Manifest()
	if ma.Step != mb.Step || ma.SampleIndex != mb.SampleIndex || string(ma.RNG) != string(mb.RNG) || ma.ConfigHash != mb.ConfigHash {
		fmt.Fprintf(c.App.Writer, "note: the training state differs: step %d vs %d, sample index %d vs %d, config hash %q vs %q, rng equal %v\n",
			ma.Step, mb.Step, ma.SampleIndex, mb.SampleIndex, ma.ConfigHash, mb.ConfigHash, string(ma.RNG) == string(mb.RNG))
	}
	switch {
	case tol.Norm && !rep.Close():
		return cli.Exit(fmt.Sprintf("ckpt diff: %d of %d groups differ (%s)", rep.GroupsDiffer(), len(rep.Groups), tol), 1)
	case !rep.Close():
		return cli.Exit(fmt.Sprintf("ckpt diff: %d of %d tensors differ (%s)", rep.Differ(), len(rep.Tensors), tol), 1)
	case tol.Norm:
		fmt.Fprintf(c.App.Writer, "equal: %d groups of %d tensors within %s\n", len(rep.Groups), len(rep.Tensors), tol)
	default:
		fmt.Fprintf(c.App.Writer, "equal: %d tensors within %s\n", len(rep.Tensors), tol)
	}
	return nil
}

// printDiff prints one line per tensor (max |a-b|, max |a-b|/|b| and the elements outside the
// tolerance; with Norm ||a-b||/||b||), and with Norm one line per group, which decides.
func printDiff(out io.Writer, rep *checkpoint.Report) error {
	norm := rep.Tolerance.Norm
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if norm {
		fmt.Fprintln(w, "TENSOR\tSHAPE\tL2_REL\tMAX_ABS\t")
	} else {
		fmt.Fprintln(w, "TENSOR\tSHAPE\tMAX_ABS\tMAX_REL\tNOT_CLOSE\t")
	}
	for _, d := range rep.Tensors {
		verdict := ""
		switch {
		case !d.Close && norm:
			verdict = "above tolerance" // the groups decide
		case !d.Close:
			verdict = "DIFFERS"
		}
		switch {
		case !d.InB:
			fmt.Fprintf(w, "%s\t%v\t\t\t\tonly in A\n", d.Name, d.ShapeA)
		case !d.InA:
			fmt.Fprintf(w, "%s\t%v\t\t\t\tonly in B\n", d.Name, d.ShapeB)
		case !d.Comparable():
			fmt.Fprintf(w, "%s\t%v vs %v\t\t\t\tshapes differ\n", d.Name, d.ShapeA, d.ShapeB)
		case norm:
			fmt.Fprintf(w, "%s\t%v\t%.6g\t%.6g\t%s\n", d.Name, d.ShapeA, d.NormRel(), d.MaxAbs, verdict)
		default:
			fmt.Fprintf(w, "%s\t%v\t%.6g\t%.6g\t%d\t%s\n", d.Name, d.ShapeA, d.MaxAbs, d.MaxRel, d.NotClose, verdict)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !norm {
		return nil
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tTENSORS\tL2_REL\t")
	for _, g := range rep.Groups {
		verdict := ""
		if !g.Close {
			verdict = "DIFFERS"
		}
		fmt.Fprintf(w, "%s\t%d\t%.6g\t%s\n", g.Name, g.Tensors, g.NormRel(), verdict)
	}
	return w.Flush()
}

// dirSize is the total size of the regular files directly in dir.
func dirSize(dir string) int64 {
	des, _ := os.ReadDir(dir)
	var n int64
	for _, de := range des {
		if info, err := de.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
	}
	return n
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// ckptBench is `gorun ckpt bench`: one ckptbench run, printed as one JSON
// line.
func ckptBench(c *cli.Context) error {
	cfg := ckptbench.Config{Dir: c.String("dir"), Bytes: c.Int64("bytes"), Ranks: c.Int("ranks"), Fill: c.String("fill")}
	if err := cfg.Validate(); err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	res, err := ckptbench.Run(c.Context, cfg)
	if err != nil {
		return err
	}
	return json.NewEncoder(c.App.Writer).Encode(res)
}
