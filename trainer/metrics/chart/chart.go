package chart

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/gorun/gorun/trainer/metrics"
)

// Format is an image format Render writes.
type Format string

// The formats Render writes.
const (
	PNG Format = "png"
	SVG Format = "svg"
)

// Size of the picture: 8 x 6 inches, 800 x 600 pixels in PNG.
const (
	Width  = 8 * vg.Inch
	Height = 6 * vg.Inch
	DPI    = 100
)

// FormatOf is the format the file name path asks for by its extension
// (.png or .svg, any case); another extension is an error that lists the
// ones that work.
func FormatOf(path string) (Format, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".png":
		return PNG, nil
	case ".svg":
		return SVG, nil
	case "":
		return "", fmt.Errorf("chart: %s has no extension: name it .png or .svg, the format follows", path)
	default:
		return "", fmt.Errorf("chart: %s: unknown image format %q: name it .png or .svg", path, ext)
	}
}

// Change is a place in a run where its workers started again or its world
// size changed: between the record of step Step-1 and that of Step.
type Change struct {
	Step     int
	From, To int // world sizes before and after
	// Restart says a new process wrote the records from Step on (its
	// elapsed_s went back); false with From != To is an in-place
	// recovery.
	Restart bool
}

// Label is how the chart names c, e.g. "restart, world 2→1".
func (c Change) Label() string {
	var parts []string
	if c.Restart {
		parts = append(parts, "restart")
	}
	if c.From != c.To {
		parts = append(parts, fmt.Sprintf("world %d→%d", c.From, c.To))
	}
	return strings.Join(parts, ", ")
}

// Changes lists the changes in recs (in file order): a world size that
// differs from the previous record's, or an elapsed_s below the previous
// record's (a new process).
func Changes(recs []metrics.Record) []Change {
	var out []Change
	for i := 1; i < len(recs); i++ {
		prev, cur := recs[i-1], recs[i]
		restart := cur.ElapsedS < prev.ElapsedS // NaN compares false: no restart
		if restart || cur.WorldSize != prev.WorldSize {
			out = append(out, Change{Step: cur.Step, From: prev.WorldSize, To: cur.WorldSize, Restart: restart})
		}
	}
	return out
}

// WriteFile draws recs (at least one) into the file path, in the format
// its extension names (see FormatOf), under title. The file is written
// only when the drawing succeeds.
func WriteFile(path string, recs []metrics.Record, title string) error {
	format, err := FormatOf(path)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("chart: write %s: %w", path, err)
	}
	err = Render(f, recs, format, title)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("chart: write %s: %w", path, cerr)
	}
	if err == nil {
		if err = os.Rename(f.Name(), path); err != nil {
			err = fmt.Errorf("chart: write %s: %w", path, err)
		}
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// Render draws recs (at least one) in format to w: the training loss (and
// the held-out loss when recorded) against the step on the upper panel,
// the whole job's tokens per second on the lower one, both under title,
// with a dashed vertical line at every Change.
func Render(w io.Writer, recs []metrics.Record, format Format, title string) error {
	if len(recs) == 0 {
		return fmt.Errorf("chart: render: no records to draw")
	}
	loss, err := lossPanel(recs, title)
	if err != nil {
		return err
	}
	speed, err := speedPanel(recs)
	if err != nil {
		return err
	}
	lo, hi := stepRange(recs)
	changes := Changes(recs)
	legendLines := 0
	if len(heldOut(recs)) > 0 {
		legendLines = 2
	}
	for _, p := range []*plot.Plot{loss, speed} {
		p.X.Min, p.X.Max = lo, hi
		p.Add(changeLines{changes: changes, labels: p == loss, below: legendLines})
	}
	var canvas vg.CanvasWriterTo
	switch format {
	case PNG:
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(Width, Height), vgimg.UseDPI(DPI))}
	case SVG:
		canvas = vgsvg.New(Width, Height)
	default:
		return fmt.Errorf("chart: render: unknown format %q: want png or svg", format)
	}
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6),
		PadRight: vg.Points(14), PadY: vg.Points(10)}
	panels := [][]*plot.Plot{{loss}, {speed}}
	for i, row := range plot.Align(panels, tiles, draw.New(canvas)) {
		panels[i][0].Draw(row[0])
	}
	if _, err := canvas.WriteTo(w); err != nil {
		return fmt.Errorf("chart: render %s: %w", format, err)
	}
	return nil
}

// Colours of the series.
var (
	lossColor   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	valColor    = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	speedColor  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	changeColor = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// lossPanel is the upper panel: loss against step.
func lossPanel(recs []metrics.Record, title string) (*plot.Plot, error) {
	p := newPanel("loss (nats per byte)")
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Legend.Top = true
	// A legend only when there are two lines: the axis names the one.
	val := heldOut(recs)
	name := ""
	if len(val) > 0 {
		name = "training loss"
	}
	if err := addLine(p, series(recs, func(r metrics.Record) float64 { return r.Loss }), lossColor, name); err != nil {
		return nil, err
	}
	if err := addLine(p, val, valColor, "held-out loss"); err != nil {
		return nil, err
	}
	return p, nil
}

// heldOut is the series of held-out losses in recs.
func heldOut(recs []metrics.Record) plotter.XYs {
	return series(recs, func(r metrics.Record) float64 { return r.ValLoss })
}

// speedPanel is the lower panel: the whole job's tokens per second.
func speedPanel(recs []metrics.Record) (*plot.Plot, error) {
	p := newPanel("tokens/s (whole job)")
	p.X.Label.Text = "step"
	p.Y.Tick.Marker = siTicks{}
	p.Y.Min = 0
	if err := addLine(p, series(recs, func(r metrics.Record) float64 { return r.TokensPerS }), speedColor, ""); err != nil {
		return nil, err
	}
	return p, nil
}

// newPanel is a plot with a grid and the y axis labelled ylabel.
func newPanel(ylabel string) *plot.Plot {
	p := plot.New()
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	return p
}

// addLine adds the line xys to p in colour c, named name in the legend
// ("" for no legend entry). An empty series adds nothing.
func addLine(p *plot.Plot, xys plotter.XYs, c color.Color, name string) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return fmt.Errorf("chart: %s: %w", name, err)
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

// series is the points (step, value(r)) of the records whose value is a
// finite number; NaN and 0 (not recorded) are left out.
func series(recs []metrics.Record, value func(metrics.Record) float64) plotter.XYs {
	var xys plotter.XYs
	for _, r := range recs {
		if v := value(r); v != 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
			xys = append(xys, plotter.XY{X: float64(r.Step), Y: v})
		}
	}
	return xys
}

// stepRange is the x range of the chart: the first and last step, at
// least one step wide.
func stepRange(recs []metrics.Record) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, r := range recs {
		lo, hi = min(lo, float64(r.Step)), max(hi, float64(r.Step))
	}
	if hi-lo < 1 {
		hi = lo + 1
	}
	return lo, hi
}

// changeLines is a plot.Plotter of a dashed vertical line at each change,
// named at its top (below that many legend lines) when labels is set. It
// has no data range of its own.
type changeLines struct {
	changes []Change
	labels  bool
	below   int
}

// Plot draws the lines on c.
func (l changeLines) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	line := draw.LineStyle{Color: changeColor, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
	label := p.X.Tick.Label
	label.Color = changeColor
	label.XAlign = draw.XLeft
	label.YAlign = draw.YTop
	for i, ch := range l.changes {
		x := trX(float64(ch.Step) - 0.5)
		c.StrokeLine2(line, x, c.Min.Y, x, c.Max.Y)
		if l.labels {
			// Stagger the labels of nearby changes down the panel.
			y := c.Max.Y - vg.Points(4) - vg.Length(l.below+i%3)*label.Height("0")
			c.FillText(label, vg.Point{X: x + vg.Points(3), Y: y}, ch.Label())
		}
	}
}

// siTicks labels the default ticks with k and M suffixes (12k, 1.5M).
type siTicks struct{}

// Ticks returns plot.DefaultTicks with shorter labels.
func (siTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = si(t.Value)
		}
	}
	return ticks
}

// si formats v with a k or M suffix.
func si(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trimFloat(v/1e6) + "M"
	case a >= 1e3:
		return trimFloat(v/1e3) + "k"
	default:
		return trimFloat(v)
	}
}

func trimFloat(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}
