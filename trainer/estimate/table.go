package estimate

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable writes es as an aligned table, one strategy a line, sizes in
// decimal units; the row of strategy selected (if any) is marked with *.
// It returns the first write error.
func WriteTable(w io.Writer, es []Estimate, selected string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tshards\treplicas\tparams\tgrads\toptimizer\tactivations\ttotal\t")
	for _, e := range es {
		name := e.Strategy
		if name == selected {
			name += " *"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, e.Shards, e.Replicas,
			FormatBytes(e.Params), FormatBytes(e.Grads), FormatBytes(e.Optimizer), FormatBytes(e.Activations), FormatBytes(e.Total))
	}
	return tw.Flush()
}

// WriteJSON writes es as JSON lines, one object per strategy with its
// bytes per component and the total; the strategy selected gets
// "selected": true.
func WriteJSON(w io.Writer, es []Estimate, selected string) error {
	enc := json.NewEncoder(w)
	for _, e := range es {
		row := struct {
			Estimate
			Selected bool `json:"selected,omitempty"`
		}{e, e.Strategy == selected}
		if err := enc.Encode(row); err != nil {
			return fmt.Errorf("estimate: write json: %w", err)
		}
	}
	return nil
}

// FormatBytes writes n in decimal units with three significant digits or
// more: 512 B, 2.35 GB, 482.3 kB, 22.3 GB.
func FormatBytes(n int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB"}
	v, i := float64(n), 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	switch {
	case i == 0:
		return fmt.Sprintf("%d B", n)
	case v < 10:
		return fmt.Sprintf("%.2f %s", v, units[i])
	default:
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
}
