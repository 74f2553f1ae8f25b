package heartbeat

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/distenv"
)

// Await is what an await line says: the worker's world broke after step
// Step completed, it lost peer rank LostPeer (-1: unknown), and it waits
// for its contract in the next round instead of exiting. One line,
//
//	await 41 peer=5
type Await struct {
	Step     int
	LostPeer int
	// At is when the agent received the line (not part of it); zero on
	// the worker side.
	At time.Time
}

// Line is a as one line of the channel, newline included.
func (a Await) Line() string { return fmt.Sprintf("await %d peer=%d\n", a.Step, a.LostPeer) }

// awaitWord, silentWord, roundWord, nextWord, readyWord and requeueWord
// start the channel's lines that are not progress.
const (
	awaitWord   = "await"
	silentWord  = "silent"
	roundWord   = "round"
	nextWord    = "next"
	readyWord   = "ready"
	requeueWord = "requeue"
	execWord    = "exec"
)

// SilentAfter is how long a worker hears nothing from a peer rank (no
// heartbeat of the collectives' control connections) before it tells its
// agent (Beater.Silent): short, so that a network fault that costs no
// lease (a one-way drop, heavy loss) is acted on well within the lease
// TTL. A silence is only a suspicion: the agent acts on it only when a
// probe of the peer's node fails too, so a busy machine's late heartbeat
// costs one probe.
const SilentAfter = 500 * time.Millisecond

// SilentLine is the line saying the worker heard nothing from peer rank
// peer for SilentAfter, newline included:
//
//	silent peer=5
func SilentLine(peer int) string { return fmt.Sprintf("%s peer=%d\n", silentWord, peer) }

// ParseSilent reads a silent line (with or without its newline); ok is
// false when line is not one, and one without a valid peer=RANK
// (RANK >= 0) is an error.
func ParseSilent(line string) (peer int, ok bool, err error) {
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != silentWord {
		return 0, false, nil
	}
	if len(fields) != 2 {
		return 0, true, fmt.Errorf("heartbeat: line %q: want %q", line, "silent peer=RANK")
	}
	v, found := strings.CutPrefix(fields[1], "peer=")
	if !found {
		return 0, true, fmt.Errorf("heartbeat: line %q: want %q", line, "silent peer=RANK")
	}
	if peer, err = strconv.Atoi(v); err != nil || peer < 0 {
		return 0, true, fmt.Errorf("heartbeat: line %q: peer %q is not a rank", line, v)
	}
	return peer, true, nil
}

// ParseAwait reads an await line (with or without its newline); ok is
// false when line is not one. A missing peer field is -1 (unknown); a
// malformed step or peer is an error.
func ParseAwait(line string) (a Await, ok bool, err error) {
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != awaitWord {
		return Await{}, false, nil
	}
	if len(fields) < 2 {
		return Await{}, true, fmt.Errorf("heartbeat: line %q: no step", line)
	}
	a = Await{LostPeer: -1}
	if a.Step, err = strconv.Atoi(fields[1]); err != nil {
		return Await{}, true, fmt.Errorf("heartbeat: line %q: step: %w", line, err)
	}
	for _, kv := range fields[2:] {
		if v, found := strings.CutPrefix(kv, "peer="); found {
			if a.LostPeer, err = strconv.Atoi(v); err != nil {
				return Await{}, true, fmt.Errorf("heartbeat: line %q: peer: %w", line, err)
			}
		}
	}
	return a, true, nil
}

// RoundLine is the agent's line giving a worker its contract w in the
// next round: "round " and w as JSON, newline included.
func RoundLine(w distenv.Worker) (string, error) {
	data, err := json.Marshal(w)
	if err != nil {
		return "", fmt.Errorf("heartbeat: round line of rank %d: %w", w.Rank, err)
	}
	return roundWord + " " + string(data) + "\n", nil
}

// ExecLine is the agent's line that makes a warm worker (one started
// ahead of its round, which awaits it: python/gorun/_warm.py) the worker
// of its round: "exec " and {"env": env} as JSON, newline included; env
// (KEY=VALUE) is the worker's whole environment.
func ExecLine(env []string) (string, error) {
	data, err := json.Marshal(struct {
		Env []string `json:"env"`
	}{env})
	if err != nil {
		return "", fmt.Errorf("heartbeat: exec line: %w", err)
	}
	return execWord + " " + string(data) + "\n", nil
}

// NextLine is RoundLine for a worker whose world is intact (the next
// round only adds nodes): "next " and w as JSON. The worker goes into the
// round at the next step boundary its world's ranks agree on, not at
// once, so that no rank is left a step ahead of the others.
func NextLine(w distenv.Worker) (string, error) {
	line, err := RoundLine(w)
	if err != nil {
		return "", err
	}
	return nextWord + strings.TrimPrefix(line, roundWord), nil
}

// Contract is a worker's contract in the next round as its agent sent
// it: AtBoundary for a next line (NextLine), else a round line.
type Contract struct {
	distenv.Worker
	AtBoundary bool
}

// ParseRound reads a round line (with or without its newline); ok is
// false when line is not one, and a round line whose contract is not
// JSON of a distenv.Worker is an error (fields it does not know are
// ignored, so a newer agent may add some). A next line reads as its
// round line.
func ParseRound(line string) (w distenv.Worker, ok bool, err error) {
	c, ok, err := ParseContract(line)
	return c.Worker, ok, err
}

// ParseContract reads a round or a next line; ok is false when line is
// neither.
func ParseContract(line string) (c Contract, ok bool, err error) {
	line = strings.TrimSpace(line)
	rest, found := strings.CutPrefix(line, roundWord+" ")
	if !found {
		if rest, found = strings.CutPrefix(line, nextWord+" "); !found {
			return Contract{}, false, nil
		}
		c.AtBoundary = true
	}
	if err := json.Unmarshal([]byte(rest), &c.Worker); err != nil {
		return Contract{}, true, fmt.Errorf("heartbeat: round line: %w", err)
	}
	return c, true, nil
}
