package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/comm/commbench"
)

// benchCommCommand is `gorun bench comm`: all-reduce, reduce-scatter and
// all-gather bus bandwidth of trainer/comm beside torch.distributed's gloo,
// both as processes on this machine. It re-executes gorun as the hidden
// `gorun bench comm worker` for each of our ranks.
func benchCommCommand() *cli.Command {
	return &cli.Command{
		Name:  "comm",
		Usage: "collectives' bus bandwidth, trainer/comm beside torch.distributed gloo, ranks as local processes",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ranks", Value: "2,4", Usage: "rank counts to measure, comma-separated"},
			&cli.StringFlag{Name: "sizes", Value: "4K,64K,1M,4M,16M,64M,256M", Usage: "buffer sizes (K, M, G: KiB, MiB, GiB)"},
			&cli.StringFlag{Name: "ops", Value: strings.Join(commbench.DefaultOps(), ","), Usage: "collectives to measure"},
			&cli.StringFlag{Name: "python", Value: "/usr/bin/python3", Usage: "Python with torch for the gloo side; empty skips it"},
			&cli.BoolFlag{Name: "tcp", Usage: "also measure trainer/comm over TCP only (no Unix sockets)"},
			&cli.IntFlag{Name: "rounds", Value: 2, Usage: "runs of every side, taking turns; each measurement keeps its best (the machine may be shared)"},
			&cli.BoolFlag{Name: "json", Usage: "one JSON object per measurement instead of the table"},
		},
		Action: benchCommAction,
		Subcommands: []*cli.Command{{
			Name:   "worker",
			Usage:  "internal: one rank of trainer/comm's side",
			Hidden: true,
			Action: func(c *cli.Context) error {
				if err := commbench.RunWorker(c.Context, os.LookupEnv, c.App.Writer); err != nil {
					return cli.Exit("bench comm worker: "+err.Error(), 1)
				}
				return nil
			},
		}},
	}
}

func benchCommAction(c *cli.Context) error {
	ranks, err := parseInts(c.String("ranks"))
	if err != nil {
		return cli.Exit("--ranks: "+err.Error(), exitUsage)
	}
	sizes, err := parseSizes(c.String("sizes"))
	if err != nil {
		return cli.Exit("--sizes: "+err.Error(), exitUsage)
	}
	if c.Int("rounds") < 1 {
		return cli.Exit("--rounds: want at least 1", exitUsage)
	}
	ops := strings.Split(c.String("ops"), ",")
	for _, op := range ops {
		if !contains(commbench.DefaultOps(), op) {
			return cli.Exit(fmt.Sprintf("--ops: unknown collective %q (want %s)", op, strings.Join(commbench.DefaultOps(), ", ")), exitUsage)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench comm: %w", err)
	}
	results, err := commbench.Run(c.Context, commbench.Options{
		Ranks: ranks, Sizes: sizes, Ops: ops, Self: []string{self, "bench", "comm", "worker"},
		Python: c.String("python"), TCP: c.Bool("tcp"), Rounds: c.Int("rounds"), Stderr: c.App.ErrWriter,
	})
	if err != nil {
		return cli.Exit("bench comm: "+err.Error(), 1)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	return printCommTable(c.App.Writer, results, c.Bool("tcp"))
}

// printCommTable prints one row per op, ranks and size: gloo's bus
// bandwidth beside ours and the ratio.
func printCommTable(out io.Writer, results []commbench.Result, tcp bool) error {
	type key struct {
		op    string
		ranks int
		bytes int64
	}
	by := map[key]map[string]commbench.Result{}
	var order []key
	for _, r := range results {
		k := key{r.Op, r.Ranks, r.Bytes}
		if by[k] == nil {
			by[k] = map[string]commbench.Result{}
			order = append(order, k)
		}
		by[k][r.Impl] = r
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "op\tranks\tsize\tgloo busbw GB/s\tgorun busbw GB/s\t"
	if tcp {
		head += "gorun-tcp busbw GB/s\t"
	}
	fmt.Fprintln(tw, head+"gorun/gloo\t")
	for _, k := range order {
		row := by[k]
		cell := func(impl string) string {
			r, ok := row[impl]
			switch {
			case !ok:
				return "-"
			case r.Error != "":
				return "unsupported"
			}
			return strconv.FormatFloat(r.BusBW, 'f', 3, 64)
		}
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t", k.op, k.ranks, sizeName(k.bytes), cell("gloo"), cell("gorun"))
		if tcp {
			line += cell("gorun-tcp") + "\t"
		}
		ratio := "-"
		if g, o := row["gloo"], row["gorun"]; g.BusBW > 0 && o.BusBW > 0 {
			ratio = fmt.Sprintf("%.2fx", o.BusBW/g.BusBW)
		}
		fmt.Fprintln(tw, line+ratio+"\t")
	}
	return tw.Flush()
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("%q is not a rank count in 1..64", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.ToUpper(strings.TrimSpace(f))
		mult := int64(1)
		for suffix, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
			if strings.HasSuffix(f, suffix) {
				f, mult = strings.TrimSuffix(f, suffix), m
			}
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 1 || n*mult > 4<<30 {
			return nil, fmt.Errorf("%q is not a size from 1 byte to 4G", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

func sizeName(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
