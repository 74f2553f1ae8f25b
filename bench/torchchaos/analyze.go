package main

import (
	"regexp"
	"slices"
	"sort"
	"strconv"
	"time"
)

// event is one line of rank 0 that the analysis reads, stamped when the driver read it.
type event struct {
	At time.Time
	// Step is N of `step N loss L` (the step N done), or of `restored step N ...` when Restored.
	Step     int
	Restored bool
	// CPU is rank 0's process CPU time at the step line, when the line says it (HasCPU: a
	// script run with --save-blocks writes `step N loss L cpu_s C`).
	CPU    time.Duration
	HasCPU bool
}

var (
	stepLine     = regexp.MustCompile(`(?:^|[\s:\]])step (\d+) loss \S+(?: cpu_s (\d+(?:\.\d+)?))?\s*$`)
	restoredLine = regexp.MustCompile(`(?:^|[\s:\]])restored step (\d+)(?: from checkpoint \S+)?\s*$`)
)

// parseLine is the event of one output line of a node (a launcher may prefix a worker's lines),
// and false for a line that is neither a step nor a restore.
func parseLine(at time.Time, line string) (event, bool) {
	if m := stepLine.FindStringSubmatch(line); m != nil {
		n, err := strconv.Atoi(m[1])
		e := event{At: at, Step: n}
		if m[2] != "" {
			cpu, cerr := strconv.ParseFloat(m[2], 64)
			e.CPU, e.HasCPU = time.Duration(cpu*float64(time.Second)), cerr == nil
		}
		return e, err == nil
	}
	if m := restoredLine.FindStringSubmatch(line); m != nil {
		n, err := strconv.Atoi(m[1])
		return event{At: at, Step: n, Restored: true}, err == nil
	}
	return event{}, false
}

// restart is where the job started training again: the index of the event that shows it (a
// `restored` line, or a step that is not one past the one before: the job began again from
// scratch), the newest step done before it and the step it went on from.
type restart struct {
	At      time.Time
	Index   int
	Reached int // the step the job had reached when it stopped (its last step line before)
	From    int // the step it went on from (the first step after it is From+1)
}

// restarts finds every restart in events (in time order).
func restarts(events []event) []restart {
	var out []restart
	last, restored := 0, false
	for i, e := range events {
		switch {
		case e.Restored:
			out = append(out, restart{At: e.At, Index: i, Reached: last, From: e.Step})
			last, restored = e.Step, true
			continue
		case e.Step != last+1 && !restored:
			// A step that does not follow the one before, with no restored line before it:
			// training began again from step e.Step-1 (nothing restored: from the start).
			out = append(out, restart{At: e.At, Index: i, Reached: last, From: e.Step - 1})
		}
		last, restored = e.Step, false
	}
	return out
}

// cost is what one failure cost the job.
type cost struct {
	Kind   string
	At     time.Time
	Victim string
	// Redone: steps done before the failure that were trained again after it.
	Redone int
	// Recovery: from the failure to the first step done after the restart.
	Recovery time.Duration
	// Unrecovered: no step was done after a restart that followed it.
	Unrecovered bool
}

// costs matches each fault to the first restart after it (faults are injected one at a time,
// each after the job recovered from the one before) and measures it.
func costs(faults []fault, events []event) []cost {
	rs := restarts(events)
	var out []cost
	for _, f := range faults {
		c := cost{Kind: f.Kind, At: f.At, Victim: f.Victim, Unrecovered: true}
		i := slices.IndexFunc(rs, func(r restart) bool { return r.At.After(f.At) })
		if i >= 0 {
			r := rs[i]
			for _, e := range events[r.Index:] {
				if !e.Restored {
					c.Redone = max(0, r.Reached-r.From)
					c.Recovery = e.At.Sub(f.At)
					c.Unrecovered = false
					break
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// summary is one run's figures from its events.
type summary struct {
	// StepTime is the median time of a step: between two step lines in a row (N, N+1).
	StepTime time.Duration
	// Wall is from the first step line to the last.
	Wall time.Duration
	// Kept is the time on the steps that the final model holds (the last time each step was
	// done): each its own step time, or StepTime for the first step after a restart, whose
	// own time holds the recovery.
	Kept  time.Duration
	Steps int // the newest step done
}

// Effective is the effective training time: the time on kept steps over the wall time.
func (s summary) Effective() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(s.Kept) / float64(s.Wall)
}

// summarize reads a run's events.
func summarize(events []event) summary {
	// own[i]: the time of steps[i] since the step before it in the same run of steps (N-1
	// right before N, no restart between them); 0 for the first of a run.
	var steps []event
	var own []time.Duration
	var ds []time.Duration
	broken := true
	for _, e := range events {
		if e.Restored {
			broken = true
			continue
		}
		d := time.Duration(0)
		if !broken && len(steps) > 0 && e.Step == steps[len(steps)-1].Step+1 {
			d = e.At.Sub(steps[len(steps)-1].At)
			ds = append(ds, d)
		}
		steps, own, broken = append(steps, e), append(own, d), false
	}
	if len(steps) == 0 {
		return summary{}
	}
	s := summary{Wall: steps[len(steps)-1].At.Sub(steps[0].At)}
	if len(ds) > 0 {
		s.StepTime = medianDuration(ds)
	}
	kept := map[int]time.Duration{}
	for i, e := range steps {
		d := own[i]
		if d == 0 && i > 0 { // the wall time starts at the first step: it has no time of its own
			d = s.StepTime
		}
		kept[e.Step] = d // a later time of the same step replaces the earlier
		s.Steps = max(s.Steps, e.Step)
	}
	for _, d := range kept {
		s.Kept += d
	}
	return s
}

// medianDuration is the median of ds (not empty); ds is not changed.
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
