package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
	"time"
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
	// TORCHELASTIC_ERROR_FILE if it wrote one, else its last stderr lines.
	Error string `json:"error"`
}

// How prints the end of the worker: "exit 3" or "SIGSEGV (exit 139)".
func (f Failure) How() string {
	if f.Signal != "" {
		return fmt.Sprintf("%s (exit %d)", f.Signal, f.ExitCode)
	}
	return "exit " + strconv.Itoa(f.ExitCode)
}

// String is one line: "rank 3 on node2 (node 1): exit 1 at 12:00:01.123: ValueError: bad",
// or, for a node lost as a whole, "node node2 lost at 12:00:01.123: ...".
func (f Failure) String() string {
	first, _, _ := strings.Cut(f.Error, "\n")
	if f.Rank < 0 {
		return fmt.Sprintf("node %s lost at %s: %s", f.Host, f.Time.Format("15:04:05.000"), first)
	}
	return fmt.Sprintf("rank %d on %s (node %d): %s at %s: %s", f.Rank, f.Host, f.NodeRank, f.How(), f.Time.Format("15:04:05.000"), first)
}
