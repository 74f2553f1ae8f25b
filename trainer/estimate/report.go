package estimate

import (
	"fmt"
	"io"
	"strings"

	"github.com/gorun/gorun/trainer/config"
)

// Report is what `gorun estimate` prints: lines that say what was
// estimated, the world, the precision, one Estimate per strategy, and the
// strategy a train.toml runs (Selected, "" for a model given by its
// sizes), whose row is the trainer's own accounting.
type Report struct {
	Header    []string
	Model     Model
	Layout    Layout
	Precision Precision
	Estimates []Estimate
	Selected  string
}

// ForConfig is the report of the train.toml cfg (read from path, which
// the header names) on nodes x procPerNode processes: every strategy in
// fp32, and the one it runs as the embedded trainer allocates it.
// optimizer, when not nil, replaces the optimizer bytes per parameter.
// The error is one of Compute's or Trainer's.
func ForConfig(path string, cfg config.Config, nodes, procPerNode int, optimizer *float64) (Report, error) {
	m, l, selected := FromConfig(cfg, nodes, procPerNode)
	mo := cfg.Model
	r := Report{Model: m, Layout: l, Precision: FP32(), Selected: selected, Header: []string{
		fmt.Sprintf("%s: %d parameters (%d layers, d_model %d, %d heads), micro batch %d x %d bytes, parallel.mode = %s",
			path, mo.Params(), mo.Layers, mo.DModel, mo.Heads, cfg.Train.MicroBatch, mo.Context, cfg.Parallel.Mode),
		"* as the embedded trainer allocates it: fp32 weights (the rank's slice and two gathered units where the mode shards them, whole" +
			" where not), the backward pass's unit buffers, AdamW's moments of the slice, recovery copies (which hold the rank's" +
			" slice of the fp64 gradient sum while the step needs no copy, except across nodes in hsdp, where grads counts it)," +
			" the collectives' buffers (comm) and the process itself (runtime: the Go runtime, the binary's pages and the garbage its collector lets grow, 5 % of the rest);" +
			" other rows: 4 B weights + 4 B gradients + 8 B AdamW per parameter",
		TrainerCheckpointing(cfg).String(),
	}}
	if _, err := cfg.Accumulation(l.Nodes * l.ProcPerNode); err != nil {
		r.Header = append(r.Header, "note: "+strings.TrimPrefix(err.Error(), "config: accumulation: "))
	}
	if err := r.compute(optimizer); err != nil {
		return Report{}, err
	}
	exact, err := Trainer(cfg, l.Nodes, l.ProcPerNode)
	if err != nil {
		return Report{}, err
	}
	for i := range r.Estimates {
		if r.Estimates[i].Strategy == exact.Strategy {
			r.Estimates[i] = exact
		}
	}
	return r, nil
}

// ForModel is the report of the model m on the world l, with the ZeRO
// paper's mixed-precision accounting; optimizer, when not nil, replaces
// its optimizer bytes per parameter. The error is Compute's.
func ForModel(m Model, l Layout, optimizer *float64) (Report, error) {
	r := Report{Model: m, Layout: l, Precision: MixedPrecision(), Header: []string{
		fmt.Sprintf("model: %s parameters, %d layers, hidden %d, %d heads, sequence %d, micro batch %d",
			FormatCount(m.Params), m.Layers, m.Hidden, m.Heads, m.Seq, m.Batch),
	}}
	if err := r.compute(optimizer); err != nil {
		return Report{}, err
	}
	return r, nil
}

// compute fills r.Estimates.
func (r *Report) compute(optimizer *float64) error {
	if optimizer != nil {
		r.Precision.Optimizer = *optimizer
	}
	es, err := Compute(r.Model, r.Layout, r.Precision)
	r.Estimates = es
	return err
}

// WriteJSON writes one JSON object per strategy, one a line (WriteJSON).
func (r Report) WriteJSON(w io.Writer) error {
	return WriteJSON(w, r.Estimates, r.Selected)
}

// WriteText writes the header, the world, the precision (for a model
// given by its sizes), the table and a footnote on the units to w, and
// returns the first write error.
func (r Report) WriteText(w io.Writer) error {
	plural := func(n int, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	}
	l, p := r.Layout, r.Precision
	world := fmt.Sprintf("world: %s x %s = %s", plural(l.Nodes, "node", "nodes"),
		plural(l.ProcPerNode, "process", "processes"), plural(l.Nodes*l.ProcPerNode, "GPU", "GPUs"))
	if l.TP > 1 {
		world += fmt.Sprintf(", tensor parallel %d, data parallel %d", l.TP, l.Nodes*l.ProcPerNode/l.TP)
	}
	lines := append(append([]string(nil), r.Header...), world)
	if r.Selected == "" {
		lines = append(lines, fmt.Sprintf("bytes per parameter: %g weights, %g gradients, %g optimizer state; activations s*b*h*L*(34 + 5*a*s/h)",
			p.Weights, p.Grads, p.Optimizer))
	}
	for _, line := range lines {
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	if err := WriteTable(w, r.Estimates, r.Selected); err != nil {
		return err
	}
	foot := "\nsizes per GPU in decimal units (1 GB = 1e9 bytes), before framework overhead, communication buffers and fragmentation"
	if r.Selected != "" {
		foot = "\nsizes per GPU in decimal units (1 GB = 1e9 bytes); the rows without * are before framework overhead," +
			" communication buffers and fragmentation\n* the strategy the train.toml runs"
	}
	_, err := fmt.Fprintln(w, foot)
	return err
}
