package status

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Snapshots is one node's PyTorch snapshots as its agent publishes them
// in its stats key (beside its straggler report, the same JSON object):
// per rank of the node the newest step and the copies on other nodes,
// and the last recovery that found snapshots.
type Snapshots struct {
	Ranks []RankSnapshot `json:"ranks"`
	// Recovery is the last agreement of this node's rounds that found
	// snapshots in the job; nil before any.
	Recovery *SnapshotRecovery `json:"recovery,omitempty"`
}

// RankSnapshot is one rank's newest complete snapshot step and its
// copies on other nodes (by their replica servers' addresses).
type RankSnapshot struct {
	Rank     int       `json:"rank"`
	Step     uint64    `json:"step"`
	Replicas []Replica `json:"replicas,omitempty"`
}

// Replica is the newest step of a rank copied to a peer.
type Replica struct {
	Peer string `json:"peer"`
	Step uint64 `json:"step"`
}

// SnapshotRecovery is what the agents agreed before a round: the step
// restored and the steps redone (the newest step any rank had less it),
// or why nothing was restored.
type SnapshotRecovery struct {
	Round    int    `json:"round"`
	Restored bool   `json:"restored"`
	Step     uint64 `json:"step"`
	Newest   uint64 `json:"newest"`
	Redone   uint64 `json:"redone"`
	Reason   string `json:"reason,omitempty"`
}

// statsSnapshots is the part of a stats value that holds Snapshots.
type statsSnapshots struct {
	Snapshots *Snapshots `json:"snapshots,omitempty"`
}

// ParseSnapshots reads the snapshots of a node's stats value; nil when it
// holds none or does not decode.
func ParseSnapshots(stats []byte) *Snapshots {
	var v statsSnapshots
	if json.Unmarshal(stats, &v) != nil {
		return nil
	}
	return v.Snapshots
}

// WithSnapshots returns the stats value report (a JSON object) with s
// added as its "snapshots" field; report is returned as it is when s is
// nil. It fails when report is not a JSON object.
func WithSnapshots(report []byte, s *Snapshots) ([]byte, error) {
	if s == nil {
		return report, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(report, &obj); err != nil {
		return nil, fmt.Errorf("status: a stats value that is not a JSON object: %w", err)
	}
	if obj == nil {
		obj = map[string]json.RawMessage{}
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	obj["snapshots"] = raw
	return json.Marshal(obj)
}

// String is the node's snapshots on one line, e.g. "rank 2 at step 57
// (copy on 10.0.0.3:4100 at 57); restored step 50 in round 1, 0 steps
// redone".
func (s Snapshots) String() string {
	var parts []string
	for _, r := range s.Ranks {
		p := fmt.Sprintf("rank %d at step %d", r.Rank, r.Step)
		var copies []string
		for _, c := range r.Replicas {
			copies = append(copies, fmt.Sprintf("%s at %d", c.Peer, c.Step))
		}
		if len(copies) > 0 {
			p += " (copies: " + strings.Join(copies, ", ") + ")"
		}
		parts = append(parts, p)
	}
	line := strings.Join(parts, ", ")
	if line == "" {
		line = "none yet"
	}
	if rec := s.Recovery; rec != nil {
		if rec.Restored {
			line += fmt.Sprintf("; restored step %d in round %d, %d steps redone", rec.Step, rec.Round, rec.Redone)
		} else {
			line += fmt.Sprintf("; round %d restored nothing: %s", rec.Round, rec.Reason)
		}
	}
	return line
}
