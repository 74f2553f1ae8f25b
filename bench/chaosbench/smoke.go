package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// smokeRecover bounds how long a smoke run waits for the job to recover from one fault (no
// action pending, and a record of a later round at the whole world size) before it fails.
const smokeRecover = 90 * time.Second

// smokeState drives a smoke run (-smoke): each fault kind once, in the seeded order, each
// injected once the job recovered from the one before (no clock: the faults never overlap),
// and the run ends once the last one recovered.
type smokeState struct {
	waiting  bool
	round    int       // the round of the last record before the fault in flight
	at       time.Time // when it was injected
	lastRead time.Time
}

// step does what is due at now: it injects the next fault, or looks (every 250 ms) whether
// the job recovered from the one in flight. It says done once every kind was injected and the
// job recovered from the last; it fails when a fault was skipped or the job did not recover
// within smokeRecover.
func (sm *smokeState) step(ctx context.Context, j *job, now time.Time) (done bool, err error) {
	if !sm.waiting {
		if len(j.faults) == len(kinds) {
			return true, nil
		}
		recs := j.records()
		if len(recs) == 0 {
			return false, fmt.Errorf("%s: no metrics record in %s", j.name, j.metrics)
		}
		sm.round = recs[len(recs)-1].Round
		j.inject(ctx)
		f := j.faults[len(j.faults)-1]
		if f.Skipped != "" {
			return false, fmt.Errorf("%s: %s was skipped (%s): the bench could not inject it; logs in %s", j.name, f.Kind, f.Skipped, filepath.Join(j.b.dir, "logs"))
		}
		sm.waiting, sm.at = true, f.At
		return false, nil
	}
	if now.Sub(sm.lastRead) < 250*time.Millisecond {
		return false, nil
	}
	sm.lastRead = now
	f := j.faults[len(j.faults)-1]
	if recs := j.records(); len(recs) > 0 && len(j.pending) == 0 {
		// Recovered: the replacement started (or the etcd member restarted), and the whole
		// world trains again, in a later round unless the fault hit no member.
		last := recs[len(recs)-1]
		if last.WorldSize == 2*nodes && (last.Round > sm.round || f.Bystander && last.Time.After(f.At)) {
			sm.waiting = false
			return false, nil
		}
	}
	if now.Sub(sm.at) > smokeRecover {
		return false, fmt.Errorf("%s: %s (%s) at %s: no record of a later round at world size %d within %v; logs in %s",
			j.name, f.Kind, f.Victim, f.At.Format("15:04:05.000"), 2*nodes, smokeRecover, filepath.Join(j.b.dir, "logs"))
	}
	return false, nil
}

// checkInjected is the smoke run's verdict on a chaos run: an error when it injected no fault,
// when a fault was skipped (the bench could not find what to hit: no worker, no aggregator),
// when a kind of fault was never injected, or when the job did not recover from one.
func checkInjected(faults []fault, costs []faultCost) error {
	var problems []string
	injected := map[string]int{}
	for _, f := range faults {
		if f.Skipped != "" {
			problems = append(problems, fmt.Sprintf("%s skipped: %s", f.Kind, f.Skipped))
			continue
		}
		injected[f.Kind]++
	}
	if len(injected) == 0 {
		problems = append(problems, fmt.Sprintf("no fault injected (%d drawn)", len(faults)))
	} else {
		for _, k := range kinds {
			if injected[k] == 0 {
				problems = append(problems, "never injected: "+k)
			}
		}
	}
	for _, c := range costs {
		if c.Unrecovered {
			problems = append(problems, fmt.Sprintf("not recovered: %s (%s)", c.Kind, c.Victim))
		}
	}
	if len(problems) > 0 {
		return errors.New("the chaos run did not do what it says: " + strings.Join(problems, "; "))
	}
	return nil
}
