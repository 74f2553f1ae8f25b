package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/trainer/metrics"
)

// faultCost is what one fault cost, from the metrics records' times.
type faultCost struct {
	fault
	// Downtime is from the last record of the world the fault hit to the first record of a
	// later round (at any world size); for a bystander fault (no member hit) from the last
	// record before it to the first after it.
	Downtime time.Duration
	// Lost is the steps the recovery threw away: the newest step recorded before the first
	// record after it, less the step it went on from.
	Lost int
	// Overlap says the job had not recovered from the previous fault yet.
	Overlap bool
	// Unrecovered says no record of a later round came after it.
	Unrecovered bool
}

// summary is what one job's metrics say.
type summary struct {
	Records, Kept int
	// Window is the training time: the first record (less one step) to the last.
	Window time.Duration
	// KeptTime is the time spent on the steps that were kept: each kept step's time from the
	// record before it in the same round; a step that opened a round counts the median step.
	KeptTime time.Duration
	// StepTime is the median time of a step (between two records of one round).
	StepTime time.Duration
	LastStep int
	Costs    []faultCost
	// Joins are the pauses of the running world as a node was taken in (a
	// spare or a replacement agent): for each round that made the world
	// larger, its last record before to its first record.
	Joins     []time.Duration
	WorldSize map[int]int // records by world size
}

// Effective is the effective training time: KeptTime / Window.
func (s summary) Effective() float64 { return s.KeptTime.Seconds() / s.Window.Seconds() }

// Rate is kept steps per second of Window.
func (s summary) Rate() float64 { return float64(s.Kept) / s.Window.Seconds() }

// analyze reads j's metrics file and costs j's faults.
func analyze(j *job) (summary, error) {
	recs, err := metrics.ReadFile(j.metrics)
	if err != nil {
		return summary{}, err
	}
	s := summary{Records: len(recs), WorldSize: map[int]int{}}
	// The steps kept, by index: metrics.History's rule (a record stands until a later record of
	// its step or of an earlier one replaces it and everything after it).
	var kept []int
	for i, r := range recs {
		for len(kept) > 0 && recs[kept[len(kept)-1]].Step >= r.Step {
			kept = kept[:len(kept)-1]
		}
		kept = append(kept, i)
	}
	if len(kept) != len(metrics.History(recs)) {
		return summary{}, fmt.Errorf("%s: %d kept steps, metrics.History says %d", j.metrics, len(kept), len(metrics.History(recs)))
	}
	s.Kept = len(kept)
	s.LastStep = recs[kept[len(kept)-1]].Step
	dt := make([]time.Duration, len(recs)) // 0: opened a round
	var steady []time.Duration
	for i, r := range recs {
		s.WorldSize[r.WorldSize]++
		if i > 0 && r.Round == recs[i-1].Round && r.Step == recs[i-1].Step+1 {
			dt[i] = r.Time.Sub(recs[i-1].Time)
			steady = append(steady, dt[i])
		}
	}
	s.StepTime = medianDuration(steady)
	for _, i := range kept {
		if dt[i] > 0 {
			s.KeptTime += dt[i]
		} else {
			s.KeptTime += s.StepTime
		}
	}
	s.Window = recs[len(recs)-1].Time.Sub(recs[0].Time) + s.StepTime
	for i := 1; i < len(recs); i++ {
		if r, prev := recs[i], recs[i-1]; r.Round > prev.Round && r.WorldSize > prev.WorldSize {
			s.Joins = append(s.Joins, r.Time.Sub(prev.Time))
		}
	}

	var prevAfter time.Time
	for _, f := range j.faults {
		if f.Skipped != "" {
			continue
		}
		c := faultCost{fault: f}
		// The last record at or before the fault, and its round.
		b := -1
		for i, r := range recs {
			if !r.Time.After(f.At) {
				b = i
			}
		}
		if b < 0 {
			continue
		}
		c.Overlap = !prevAfter.IsZero() && prevAfter.After(f.At)
		if f.Bystander {
			// No member was hit: the round goes on. Its cost is the stall of training
			// across it: the last record before it to the first after it.
			if b+1 < len(recs) {
				c.Downtime = recs[b+1].Time.Sub(recs[b].Time)
			} else {
				c.Unrecovered = true
			}
			s.Costs = append(s.Costs, c)
			continue
		}
		r0 := recs[b].Round
		a := -1
		for i := b + 1; i < len(recs); i++ {
			if recs[i].Round > r0 {
				a = i
				break
			}
			b = i // a record of the same world after the fault: the step in flight
		}
		if a < 0 {
			c.Unrecovered = true
			s.Costs = append(s.Costs, c)
			continue
		}
		prevAfter = recs[a].Time
		c.Downtime = recs[a].Time.Sub(recs[b].Time)
		newest := 0
		for _, r := range recs[:a] {
			newest = max(newest, r.Step)
		}
		c.Lost = max(0, newest-(recs[a].Step-1))
		s.Costs = append(s.Costs, c)
	}
	return s, nil
}

func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// kindRow is one line of the table: the faults of one kind.
type kindRow struct {
	Kind        string  `json:"kind"`
	N           int     `json:"n"`
	DowntimeMed float64 `json:"downtime_s_median"`
	DowntimeMax float64 `json:"downtime_s_max"`
	StepsLost   int     `json:"steps_lost"`
	LostMax     int     `json:"steps_lost_max"`
	Overlapped  int     `json:"overlapped,omitempty"`
	Unrecovered int     `json:"unrecovered,omitempty"`
}

// byKind groups costs by fault kind, in the order of kinds; kinds with no fault are left out.
func byKind(costs []faultCost) []kindRow {
	var rows []kindRow
	for _, k := range kinds {
		row := kindRow{Kind: k}
		var downs []time.Duration
		for _, c := range costs {
			if c.Kind != k {
				continue
			}
			row.N++
			if c.Overlap {
				row.Overlapped++
			}
			if c.Unrecovered {
				row.Unrecovered++
				continue
			}
			downs = append(downs, c.Downtime)
			row.StepsLost += c.Lost
			row.LostMax = max(row.LostMax, c.Lost)
		}
		if row.N == 0 {
			continue
		}
		row.DowntimeMed = medianDuration(downs).Round(time.Millisecond).Seconds()
		if len(downs) > 0 {
			row.DowntimeMax = slices.Max(downs).Round(time.Millisecond).Seconds()
		}
		rows = append(rows, row)
	}
	return rows
}

// checkpointSteps lists the steps of dir's complete checkpoints (those with a manifest).
func checkpointSteps(dir string) map[int64]bool {
	entries, _ := os.ReadDir(dir)
	out := map[int64]bool{}
	for _, e := range entries {
		step, ok := checkpoint.ParseStep(e.Name())
		if !ok {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "manifest.json")); err == nil {
			out[step] = true
		}
	}
	return out
}

// comparison is a chaos run's newest checkpoint that the fault-free run also has, against it.
type comparison struct {
	Step     int64
	AllClose bool
	MaxAbs   float64
	Err      string
}

func (c comparison) String() string {
	switch {
	case c.Err != "":
		return "not compared: " + c.Err
	case c.AllClose:
		return fmt.Sprintf("step %d allclose (rtol 1e-5, atol 1e-6) to the fault-free run, max |diff| %.1e", c.Step, c.MaxAbs)
	default:
		return fmt.Sprintf("step %d NOT allclose (rtol 1e-5, atol 1e-6) to the fault-free run: max |diff| %.3g", c.Step, c.MaxAbs)
	}
}

// compareFinal compares the newest checkpoint step both got and ref hold.
func compareFinal(ctx context.Context, got, ref string) comparison {
	g, r := checkpointSteps(got), checkpointSteps(ref)
	var common int64 = -1
	for s := range g {
		if r[s] && s > common {
			common = s
		}
	}
	if common < 0 {
		return comparison{Err: fmt.Sprintf("no checkpoint step in both %s and %s", got, ref)}
	}
	name := checkpoint.StepName(common)
	rep, err := checkpoint.CompareDirs(ctx, filepath.Join(got, name), filepath.Join(ref, name), checkpoint.Tolerance{RTol: 1e-5, ATol: 1e-6})
	if err != nil {
		return comparison{Step: common, Err: err.Error()}
	}
	c := comparison{Step: common, AllClose: true}
	for _, t := range rep.Tensors {
		if !t.Close {
			c.AllClose = false
		}
		if !math.IsNaN(t.MaxAbs) {
			c.MaxAbs = max(c.MaxAbs, t.MaxAbs)
		}
	}
	return c
}
