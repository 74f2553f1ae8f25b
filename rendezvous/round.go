package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Round is one formation of the job as one node sees it: who it is in it
// and where worker rank 0 hosts the store.
type Round struct {
	Number     int    // rounds formed before this one; TORCHELASTIC_RESTART_COUNT
	NodeRank   int    // this node's rank in the round
	NumNodes   int    // nodes in the round
	FirstRank  int    // global rank of this node's local rank 0
	WorldSize  int    // workers in the round, all nodes
	MasterAddr string // MASTER_ADDR
	MasterPort int    // MASTER_PORT
}

// Failure is one worker that ended badly on its own (not stopped by its
// agent): where it ran, how it ended and what it said.
type Failure struct {
	Host      string    `json:"host"`
	NodeRank  int       `json:"node_rank"`
	Rank      int       `json:"rank"`
	LocalRank int       `json:"local_rank"`
	PID       int       `json:"pid"`
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal,omitempty"` // "SIGSEGV" when killed by a signal
	Time      time.Time `json:"time"`
	Attempt   int       `json:"attempt"` // the round
	// Error is the worker's own error: the message of its
	// TORCHELASTIC_ERROR_FILE if it wrote one, else its last stderr lines,
	// cut to MaxErrorBytes.
	Error string `json:"error"`
	// LostPeer, when set, is the global rank whose loss made this worker
	// fail (the embedded trainer's error file names it): this failure is
	// a consequence, and the peer's own failure, once reported, is its
	// cause.
	LostPeer *int `json:"lost_peer,omitempty"`
	// Agent says gorun's agent on Host failed itself (Error says why),
	// rather than one of its workers.
	Agent bool `json:"agent,omitempty"`
	// Ranks are the global ranks a lost node held (Rank is -1 then).
	Ranks []int `json:"ranks,omitempty"`
	// Revision is the etcd revision that first recorded this failure:
	// the job-wide order of reports, set when failures are read.
	Revision int64 `json:"revision,omitempty"`
}

// MaxErrorBytes bounds a failure's Error as kept in etcd: a worker's
// multi-MiB error file must not make the report too large to store.
const MaxErrorBytes = 64 << 10

// CutError returns msg cut to at most limit bytes (at a line break when one
// is near, never inside a UTF-8 sequence) followed by a note saying how
// much was kept and, when path is not empty, where the whole text is.
func CutError(msg string, limit int, path string) string {
	if len(msg) <= limit {
		return msg
	}
	where := ""
	if path != "" {
		where = "; all of it in " + path
	}
	const noteRoom = 96 // the note without where
	keep := max(0, limit-noteRoom-len(where))
	if i := strings.LastIndexByte(msg[:keep], '\n'); i > keep/2 {
		keep = i
	}
	for keep > 0 && !utf8.RuneStart(msg[keep]) {
		keep--
	}
	return fmt.Sprintf("%s\n[cut: first %d of %d bytes shown%s]", msg[:keep], keep, len(msg), where)
}

// maxLineInString bounds the error line of Failure.String.
const maxLineInString = 240

// How prints the end of the worker: "exit 3" or "SIGSEGV (exit 139)".
func (f Failure) How() string {
	if f.Signal != "" {
		return fmt.Sprintf("%s (exit %d)", f.Signal, f.ExitCode)
	}
	return "exit " + strconv.Itoa(f.ExitCode)
}

// String is one line: "rank 3 on node2 (node 1): exit 1 at 12:00:01.123: ValueError: bad",
// for a node lost as a whole "node node2 lost at 12:00:01.123: ...", and
// for a failed agent "the agent on node2 failed at 12:00:01.123: ...".
func (f Failure) String() string {
	first, _, _ := strings.Cut(f.Error, "\n")
	if len(first) > maxLineInString {
		first = strings.ToValidUTF8(first[:maxLineInString], "") + "..."
	}
	if f.Agent {
		return fmt.Sprintf("the agent on %s failed at %s: %s", f.Host, f.Time.Format("15:04:05.000"), first)
	}
	if f.Rank < 0 {
		return fmt.Sprintf("node %s lost at %s: %s", f.Host, f.Time.Format("15:04:05.000"), first)
	}
	return fmt.Sprintf("rank %d on %s (node %d): %s at %s: %s", f.Rank, f.Host, f.NodeRank, f.How(), f.Time.Format("15:04:05.000"), first)
}

// Recovery is one in-place recovery: a round that ended for a membership
// change, whose survivors kept their workers into the next round instead
// of restarting them, as node rank 0 of the new round saw it.
type Recovery struct {
	Round     int       `json:"round"`  // the round the workers were kept into
	Host      string    `json:"host"`   // the node that recorded it
	Reason    string    `json:"reason"` // why the round before ended
	Lost      []string  `json:"lost,omitempty"`
	Nodes     int       `json:"nodes"`   // nodes of the new round
	Workers   int       `json:"workers"` // workers of the new round
	AtStep    int       `json:"at_step"` // the last step reported before the change (this node's workers)
	StepsLost int       `json:"steps_lost"`
	Seconds   float64   `json:"seconds"` // from the round's end to the first progress after it
	Time      time.Time `json:"time"`
}

// String is the recovery's log line, e.g. "round 3: node c lost at step
// 41; in place on 2 nodes (4 workers), 0 steps lost, 1.2 s".
func (r Recovery) String() string {
	what := r.Reason
	if len(r.Lost) > 0 {
		what = "node " + strings.Join(r.Lost, ", ") + " lost"
	}
	return fmt.Sprintf("round %d: %s at step %d; in place on %d nodes (%d workers), %d steps lost, %.1f s",
		r.Round, what, r.AtStep, r.Nodes, r.Workers, r.StepsLost, r.Seconds)
}
