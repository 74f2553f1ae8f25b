package goodput

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// NodeReport is one agent's Summary as it publishes it for `gorun
// status` (rewritten every few seconds and once as the agent ends).
type NodeReport struct {
	Host string    `json:"host"`
	At   time.Time `json:"at"` // when the summary was taken
	Summary
}

// Encode is r as the value an agent publishes.
func (r NodeReport) Encode() []byte {
	b, _ := json.Marshal(r) // no value of a NodeReport fails to encode
	return b
}

// ParseNodeReport reads a value NodeReport.Encode wrote.
func ParseNodeReport(b []byte) (NodeReport, error) {
	var r NodeReport
	if err := json.Unmarshal(b, &r); err != nil {
		return NodeReport{}, fmt.Errorf("goodput: a node's report: %w", err)
	}
	return r, nil
}

// Job is the job's goodput as `gorun status` shows it: the figures of
// every node that published one, added up as node-seconds (a recovery
// that stalls three nodes for 2 s loses 6 node-seconds), so that Ratio
// is the job's effective node-seconds over its wall node-seconds. The
// sums keep the nodes' identities: WallSeconds = EffectiveSeconds +
// LostSeconds + PendingSeconds, and LostSeconds is the sum of
// LostByCause and of LostByPhase. StepsRedone and Recoveries are the
// most any node saw: every node of a world sees the same recoveries and
// redoes the same steps.
type Job struct {
	Summary
	// Nodes are the nodes' own reports, by host.
	Nodes []NodeReport `json:"nodes"`
}

// JobOf adds up the nodes' reports (see Job); one not measured (no step
// yet) adds nothing but is listed.
func JobOf(nodes []NodeReport) Job {
	j := Job{Summary: Tally{}.Summary(time.Time{}), Nodes: slices.Clone(nodes)}
	slices.SortFunc(j.Nodes, func(a, b NodeReport) int { return strings.Compare(a.Host, b.Host) })
	if j.Nodes == nil {
		j.Nodes = []NodeReport{}
	}
	for _, n := range nodes {
		if !n.Measured {
			continue
		}
		s := &j.Summary
		s.Measured = true
		s.WallSeconds += n.WallSeconds
		s.EffectiveSeconds += n.EffectiveSeconds
		s.LostSeconds += n.LostSeconds
		s.PendingSeconds += n.PendingSeconds
		for k, v := range n.LostByCause {
			s.LostByCause[k] += v
		}
		for k, v := range n.LostByPhase {
			s.LostByPhase[k] += v
		}
		for c, row := range n.Lost {
			if s.Lost[c] == nil {
				s.Lost[c] = map[string]float64{}
			}
			for p, v := range row {
				s.Lost[c][p] += v
			}
		}
		s.StepsRedone = max(s.StepsRedone, n.StepsRedone)
		s.Recoveries = max(s.Recoveries, n.Recoveries)
	}
	if j.WallSeconds > 0 {
		j.Ratio = j.EffectiveSeconds / j.WallSeconds
	}
	return j
}

// Lines are j for people: at most two lines (none before a step).
func (j Job) Lines() []string {
	if !j.Measured {
		return nil
	}
	measured := 0
	for _, n := range j.Nodes {
		if n.Measured {
			measured++
		}
	}
	lines := []string{fmt.Sprintf("goodput: %.3f (effective %.1f of %.1f node-seconds, %d nodes); %d recoveries, %d steps redone",
		j.Ratio, j.EffectiveSeconds, j.WallSeconds, measured, j.Recoveries, j.StepsRedone)}
	if j.LostSeconds <= 0 {
		return lines
	}
	var causes, phases []string
	for _, c := range Causes {
		if v := j.LostByCause[c.String()]; v > 0 {
			causes = append(causes, fmt.Sprintf("%s %.1f", c, v))
		}
	}
	for _, p := range Phases {
		if v := j.LostByPhase[p.String()]; v > 0 {
			phases = append(phases, fmt.Sprintf("%s %.1f", strings.ReplaceAll(p.String(), "_", " "), v))
		}
	}
	return append(lines, fmt.Sprintf("time lost: %.1f node-seconds: %s; %s", j.LostSeconds, strings.Join(causes, ", "), strings.Join(phases, ", ")))
}

// JobOfValues is JobOf the values the agents published (by node id, as
// a status read finds them); a value that does not decode is left out.
func JobOfValues(values map[string][]byte) Job {
	var nodes []NodeReport
	for _, v := range values {
		if r, err := ParseNodeReport(v); err == nil {
			nodes = append(nodes, r)
		}
	}
	return JobOf(nodes)
}
