package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// costPair is one pair of fault-free runs of the same job, snapshots off and on, run one right
// after the other: the snapshot cost measured where the machine's drift is smallest. On a
// shared VM the median step of one configuration moves by 10-20 % between invocations, as much
// as the cost itself.
type costPair struct {
	Off, On       time.Duration // the median step of each run
	OffCPU, OnCPU time.Duration // the CPU time of each run, its every process (job.cpu)
	Steps         int           // the steps of each run
	OnFirst       bool          // the run with snapshots ran first
}

// CPUPerStep is the CPU time snapshots added per step: the runs' difference over their steps.
// Unlike the median step, it does not move with what else shares the machine's cores; on a
// machine whose cores the job keeps busy, it is what the snapshots take from the training.
func (p costPair) CPUPerStep() time.Duration {
	if p.Steps == 0 {
		return 0
	}
	return (p.OnCPU - p.OffCPU) / time.Duration(p.Steps)
}

// CPUCost is CPUPerStep as a fraction of the CPU time of a step without snapshots (OffCPU over
// the steps: the run's start-up, the same in both, included).
func (p costPair) CPUCost() float64 {
	if p.OffCPU == 0 {
		return 0
	}
	return float64(p.OnCPU-p.OffCPU) / float64(p.OffCPU)
}

// Cost is the pair's snapshot cost per step: On over Off, minus 1; 0 when either is unknown.
func (p costPair) Cost() float64 {
	if p.Off == 0 || p.On == 0 {
		return 0
	}
	return float64(p.On-p.Off) / float64(p.Off)
}

// measureCost runs b.costPairs pairs of fault-free runs (gorun, snapshots off, then on; every
// other pair on, then off, so that a drift of the machine during the bench does not favour one
// side) and returns their median steps. It returns the first run's error.
func measureCost(ctx context.Context, b *bench) ([]costPair, error) {
	off, on := way{Name: "fault-free"}, way{Name: "gorun+snapshots", Snapshots: true}
	var pairs []costPair
	for i := range b.costPairs {
		p := costPair{OnFirst: i%2 == 1, Steps: b.steps}
		order := []way{off, on}
		if p.OnFirst {
			order = []way{on, off}
		}
		for _, w := range order {
			name := fmt.Sprintf("cost-%d-%s", i, onOff(w.Snapshots, "on", "off"))
			j, err := newJob(b, w, name, false)
			if err != nil {
				return nil, err
			}
			b.logf("cost pair %d of %d: %s (%s)", i+1, b.costPairs, name, onOff(w.Snapshots, "snapshots every step", "--snapshots=false"))
			if err := j.run(ctx); err != nil {
				return nil, err
			}
			step := summarize(j.events).StepTime
			if w.Snapshots {
				p.On, p.OnCPU = step, j.cpu()
			} else {
				p.Off, p.OffCPU = step, j.cpu()
			}
		}
		pairs = append(pairs, p)
	}
	return pairs, nil
}

// medianCost is the median of the pairs' costs (the mean of the middle two for an even count).
func medianCost(pairs []costPair) float64 { return medianOf(pairs, costPair.Cost) }

// medianOf is the median of f over the pairs (the mean of the middle two for an even count).
func medianOf(pairs []costPair, f func(costPair) float64) float64 {
	cs := make([]float64, len(pairs))
	for i, p := range pairs {
		cs[i] = f(p)
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

// printCostPairs prints the pairs' line, if any: the median cost and each pair's.
func printCostPairs(w io.Writer, pairs []costPair) {
	if len(pairs) == 0 {
		return
	}
	each := make([]string, len(pairs))
	for i, p := range pairs {
		each[i] = fmt.Sprintf("%+.1f %% (%.3f s -> %.3f s%s)", 100*p.Cost(), p.Off.Seconds(), p.On.Seconds(), onOff(p.OnFirst, ", on first", ""))
	}
	fmt.Fprintf(w, "\nsnapshot cost per step, %d fault-free pairs (snapshots off, on; one right after the other): median %+.1f %%; each: %s\n",
		len(pairs), 100*medianCost(pairs), strings.Join(each, ", "))
	cpu := make([]string, len(pairs))
	for i, p := range pairs {
		cpu[i] = fmt.Sprintf("%+.1f %% (%.0f ms a step; %.1f s -> %.1f s)", 100*p.CPUCost(), float64(p.CPUPerStep())/1e6, p.OffCPU.Seconds(), p.OnCPU.Seconds())
	}
	fmt.Fprintf(w, "snapshot CPU per step, the same pairs (every process's CPU time, on minus off, over %d steps; start-up included in both): median %+.1f %%; each: %s\n",
		pairs[0].Steps, 100*medianOf(pairs, costPair.CPUCost), strings.Join(cpu, ", "))
}

// costPairsJSON is the pairs as one JSON object.
func costPairsJSON(pairs []costPair) any {
	type pairJSON struct {
		OffS     float64 `json:"step_s_off"`
		OnS      float64 `json:"step_s_on"`
		Cost     float64 `json:"cost"`
		OffCPUS  float64 `json:"cpu_s_off"`
		OnCPUS   float64 `json:"cpu_s_on"`
		CPUCost  float64 `json:"cpu_cost"`
		CPUStepS float64 `json:"cpu_s_per_step"`
		OnFirst  bool    `json:"on_first"`
	}
	v := struct {
		Median    float64    `json:"snapshot_cost_per_step_median"`
		CPUMedian float64    `json:"snapshot_cpu_cost_median"`
		Pairs     []pairJSON `json:"cost_pairs"`
	}{Median: round3(medianCost(pairs)), CPUMedian: round3(medianOf(pairs, costPair.CPUCost))}
	for _, p := range pairs {
		v.Pairs = append(v.Pairs, pairJSON{round3(p.Off.Seconds()), round3(p.On.Seconds()), round3(p.Cost()),
			round3(p.OffCPU.Seconds()), round3(p.OnCPU.Seconds()), round3(p.CPUCost()), round3(p.CPUPerStep().Seconds()), p.OnFirst})
	}
	return v
}
