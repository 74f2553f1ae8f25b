package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// costBlock is the steps of a block of a cost run: the script saves a snapshot after each step
// of every other block (--save-blocks), so a run holds steps with and without one side by side.
const costBlock = 4

// blockCost is what one cost run measured: the steps after which the script saved a snapshot
// against those after which it did not, all in one fault-free run. Pairs of runs (one with
// snapshots, one without) did not measure it: on a shared 2-core VM two runs of the same job
// differ by 10-30 % in median step, as much as the cost itself, while neighbouring blocks of one
// run see the same machine.
type blockCost struct {
	On, Off       time.Duration // the median step time of each kind
	OnCPU, OffCPU time.Duration // the median CPU time of rank 0's process per step of each kind
	NOn, NOff     int           // the steps measured of each kind
}

// savesAfter says whether a script run with --save-blocks block saved after step s (from 1).
func savesAfter(s, block int) bool { return (s-1)/block%2 == 0 }

// blockCostOf reads a cost run's events (block: its --save-blocks). Step s is measured, by the
// time and rank 0's CPU time since step s-1's line, when step s-1's line came right before it
// (no restart) and the script saved after both or after neither: so the first step of a block,
// which may still carry the last snapshot of the block before, is left out.
func blockCostOf(events []event, block int) blockCost {
	var on, off, onCPU, offCPU []time.Duration
	for i := 1; i < len(events); i++ {
		prev, e := events[i-1], events[i]
		if e.Restored || prev.Restored || e.Step != prev.Step+1 || !e.HasCPU || !prev.HasCPU ||
			savesAfter(e.Step, block) != savesAfter(prev.Step, block) {
			continue
		}
		d, cpu := e.At.Sub(prev.At), e.CPU-prev.CPU
		if savesAfter(e.Step, block) {
			on, onCPU = append(on, d), append(onCPU, cpu)
		} else {
			off, offCPU = append(off, d), append(offCPU, cpu)
		}
	}
	c := blockCost{NOn: len(on), NOff: len(off)}
	if len(on) > 0 && len(off) > 0 {
		c.On, c.Off, c.OnCPU, c.OffCPU = medianDuration(on), medianDuration(off), medianDuration(onCPU), medianDuration(offCPU)
	}
	return c
}

// Cost is the snapshot's cost per step: the median step with one over the median step without,
// minus 1; 0 when either kind was not measured.
func (c blockCost) Cost() float64 { return ratioLess1(c.On, c.Off) }

// CPUCost is the CPU time a snapshot adds to rank 0's step (rank 0 saves: it is its node's local
// rank 0) as a fraction of its step's CPU time without one; 0 when not measured.
func (c blockCost) CPUCost() float64 { return ratioLess1(c.OnCPU, c.OffCPU) }

func ratioLess1(a, b time.Duration) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return float64(a-b) / float64(b)
}

// measureCost runs b.costRuns fault-free cost runs (gorun, snapshots on, the script saving in
// every other block of costBlock steps) and returns what each measured. It returns the first
// run's error.
func measureCost(ctx context.Context, b *bench) ([]blockCost, error) {
	w := way{Name: "gorun+snapshots", Snapshots: true, SaveBlocks: costBlock}
	var runs []blockCost
	for i := range b.costRuns {
		name := fmt.Sprintf("cost-%d", i)
		j, err := newJob(b, w, name, false)
		if err != nil {
			return nil, err
		}
		b.logf("cost run %d of %d: %s (a snapshot after each step of every other block of %d steps)", i+1, b.costRuns, name, costBlock)
		if err := j.run(ctx); err != nil {
			return nil, err
		}
		c := blockCostOf(j.events, costBlock)
		if c.NOn == 0 || c.NOff == 0 {
			return nil, fmt.Errorf("cost run %s: %d steps measured with a snapshot and %d without: want some of each (STEPS %d, blocks of %d)",
				name, c.NOn, c.NOff, b.steps, costBlock)
		}
		runs = append(runs, c)
	}
	return runs, nil
}

// medianOf is the median of f over the runs (the mean of the middle two for an even count; 0 for none).
func medianOf(runs []blockCost, f func(blockCost) float64) float64 {
	cs := make([]float64, len(runs))
	for i, r := range runs {
		cs[i] = f(r)
	}
	slices.Sort(cs)
	n := len(cs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return cs[n/2]
	}
	return (cs[n/2-1] + cs[n/2]) / 2
}

// printCost prints the cost runs' lines, if any: the median over the runs and each run's.
func printCost(w io.Writer, runs []blockCost) {
	if len(runs) == 0 {
		return
	}
	each := make([]string, len(runs))
	cpu := make([]string, len(runs))
	for i, r := range runs {
		each[i] = fmt.Sprintf("%+.1f %% (%.3f s -> %.3f s; %d and %d steps)", 100*r.Cost(), r.Off.Seconds(), r.On.Seconds(), r.NOff, r.NOn)
		cpu[i] = fmt.Sprintf("%+.1f %% (%.0f -> %.0f ms)", 100*r.CPUCost(), ms(r.OffCPU), ms(r.OnCPU))
	}
	fmt.Fprintf(w, "\nsnapshot cost per step, %d fault-free run(s) saving in every other block of %d steps (median step without -> with a snapshot): median %+.1f %%; each: %s\n",
		len(runs), costBlock, 100*medianOf(runs, blockCost.Cost), strings.Join(each, ", "))
	fmt.Fprintf(w, "rank 0's CPU time per step (it saves its node's snapshot), the same steps: median %+.1f %%; each: %s\n",
		100*medianOf(runs, blockCost.CPUCost), strings.Join(cpu, ", "))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// costJSON is the cost runs as one JSON object.
func costJSON(runs []blockCost) any {
	type runJSON struct {
		OffS     float64 `json:"step_s_off"`
		OnS      float64 `json:"step_s_on"`
		Cost     float64 `json:"cost"`
		OffCPUS  float64 `json:"rank0_cpu_s_off"`
		OnCPUS   float64 `json:"rank0_cpu_s_on"`
		CPUCost  float64 `json:"rank0_cpu_cost"`
		StepsOff int     `json:"steps_off"`
		StepsOn  int     `json:"steps_on"`
	}
	v := struct {
		Median    float64   `json:"snapshot_cost_per_step_median"`
		CPUMedian float64   `json:"rank0_cpu_cost_median"`
		Block     int       `json:"block_steps"`
		Runs      []runJSON `json:"cost_runs"`
	}{Median: round3(medianOf(runs, blockCost.Cost)), CPUMedian: round3(medianOf(runs, blockCost.CPUCost)), Block: costBlock}
	for _, r := range runs {
		v.Runs = append(v.Runs, runJSON{round3(r.Off.Seconds()), round3(r.On.Seconds()), round3(r.Cost()),
			round3(r.OffCPU.Seconds()), round3(r.OnCPU.Seconds()), round3(r.CPUCost()), r.NOff, r.NOn})
	}
	return v
}
