package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// warmLog is one of the agent's log lines about warm workers (JSON).
type warmLog struct {
	Message  string `json:"message"`
	Round    int    `json:"round"`
	Pids     []int  `json:"pids"`      // "started warm workers for the next round"
	WarmPids []int  `json:"warm_pids"` // "the round's workers started: ..."
	Fresh    int    `json:"fresh"`
}

// warmLogs parses an agent's stderr: the pids of every warm worker it
// started, and per round the pids of the warm workers the round took and
// how many it started fresh.
func warmLogs(stderr string) (started []int, rounds []warmLog) {
	for _, l := range strings.Split(stderr, "\n") {
		var w warmLog
		if json.Unmarshal([]byte(l), &w) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(w.Message, "started warm workers"):
			started = append(started, w.Pids...)
		case strings.HasPrefix(w.Message, "the round's workers started"):
			rounds = append(rounds, w)
		}
	}
	return started, rounds
}

// warmWorkerKill is TestSnapshotsWorkerKill under --warm-workers, against
// the fault-free model at ref: a worker killed with SIGKILL in the middle
// of training. Every round's workers are warm ones (interpreters that
// imported torch before the round and waited, as gorun-warm, for its
// environment): the first round's, started while the agent joined, and the
// round after the kill's. The restarted workers restore the agreed step,
// and the final model is bit-identical to the fault-free run's; no process
// and no snapshot directory is left (the warm workers no round took are
// stopped).
func warmWorkerKill(t *testing.T, ref string) {
	got := filepath.Join(t.TempDir(), "got.pt")
	id := "warm-kill-" + newMarker(t)

	p, w := startAndKillRank1(t, id, got, "--warm-workers")
	res := p.wait()
	if res.ExitCode != 0 {
		t.Fatalf("exit %d after the worker kill, want 0", res.ExitCode)
	}
	started, rounds := warmLogs(res.Stderr)
	if len(rounds) != 2 {
		t.Fatalf("want the workers of two rounds started, got %+v", rounds)
	}
	for _, rd := range rounds {
		if len(rd.WarmPids) != 2 || rd.Fresh != 0 {
			t.Errorf("round %d: warm workers %v and %d fresh ones; want both warm", rd.Round, rd.WarmPids, rd.Fresh)
		}
		for _, pid := range rd.WarmPids {
			if !slices.Contains(started, pid) {
				t.Errorf("round %d took pid %d, which no warm worker had (warm: %v)", rd.Round, pid, started)
			}
		}
	}
	if slices.Contains(rounds[1].WarmPids, w.PID) {
		t.Errorf("round 1 took the killed worker's pid %d", w.PID)
	}
	agreed := agreements(res.Stderr)
	if len(agreed) != 2 || !agreed[1].Restore || agreed[1].Step < snapKillAt {
		t.Fatalf("want a restore of step %d or later after the kill; agreements %+v", snapKillAt, agreed)
	}
	if !strings.Contains(res.Stdout, fmt.Sprintf("restored step %d\n", agreed[1].Step)) {
		t.Errorf("rank 0 did not say it restored step %d", agreed[1].Step)
	}
	requireSameModel(t, ref, got)
	requireNoShm(t, id)
}
