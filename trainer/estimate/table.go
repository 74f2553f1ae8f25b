package estimate

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteTable writes es as an aligned table, one strategy a line, sizes in
// decimal units; the row of strategy selected (if any) is marked with *.
// The copies column is there when a row has copies, the comm and runtime
// columns when a row has either. It returns the first write error.
func WriteTable(w io.Writer, es []Estimate, selected string) error {
	copies := slices.ContainsFunc(es, func(e Estimate) bool { return e.Copies > 0 })
	runtime := slices.ContainsFunc(es, func(e Estimate) bool { return e.Comm > 0 || e.Runtime > 0 })
	head := []string{"strategy", "shards", "replicas", "params", "grads", "optimizer"}
	if copies {
		head = append(head, "copies")
	}
	head = append(head, "activations")
	if runtime {
		head = append(head, "comm", "runtime")
	}
	rows := [][]string{append(head, "total")}
	for _, e := range es {
		name := e.Strategy
		if name == selected {
			name += " *"
		}
		row := []string{name, fmt.Sprint(e.Shards), fmt.Sprint(e.Replicas), FormatBytes(e.Params), FormatBytes(e.Grads), FormatBytes(e.Optimizer)}
		if copies {
			row = append(row, FormatBytes(e.Copies))
		}
		row = append(row, FormatBytes(e.Activations))
		if runtime {
			row = append(row, FormatBytes(e.Comm), FormatBytes(e.Runtime))
		}
		rows = append(rows, append(row, FormatBytes(e.Total)))
	}
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, cell := range r {
			width[i] = max(width[i], len(cell))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, cell := range r {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], cell)
				continue
			}
			fmt.Fprintf(&b, "  %*s", width[i], cell)
		}
		if _, err := fmt.Fprintln(w, b.String()); err != nil {
			return err
		}
	}
	return nil
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

// FormatCount writes a parameter count briefly: 120576, 147M, 6.738B.
func FormatCount(n float64) string {
	for _, u := range []struct {
		v    float64
		name string
	}{{1e12, "T"}, {1e9, "B"}, {1e6, "M"}} {
		if n >= u.v {
			return fmt.Sprintf("%.4g%s", n/u.v, u.name)
		}
	}
	return fmt.Sprintf("%.0f", n)
}
