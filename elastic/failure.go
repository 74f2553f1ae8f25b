package elastic

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WorkerFailure is one worker that ended badly on its own (not stopped by
// the agent): where it ran, how it ended and what it said.
type WorkerFailure struct {
	Host      string    `json:"host"`
	NodeRank  int       `json:"node_rank"`
	Rank      int       `json:"rank"`
	LocalRank int       `json:"local_rank"`
	PID       int       `json:"pid"`
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal,omitempty"` // "SIGSEGV" when killed by a signal
	Time      time.Time `json:"time"`
	Attempt   int       `json:"attempt"`
	// Error is the worker's own error: the message of its
	// TORCHELASTIC_ERROR_FILE if it wrote one, else its last stderr lines.
	Error string `json:"error"`
}

// How prints the end of the worker: "exit 3" or "SIGSEGV (exit 139)".
func (f WorkerFailure) How() string {
	if f.Signal != "" {
		return fmt.Sprintf("%s (exit %d)", f.Signal, f.ExitCode)
	}
	return "exit " + strconv.Itoa(f.ExitCode)
}

// String is one line: "rank 3 on node2 (node 1): exit 1 at 12:00:01.123: ValueError: bad".
func (f WorkerFailure) String() string {
	first, _, _ := strings.Cut(f.Error, "\n")
	return fmt.Sprintf("rank %d on %s (node %d): %s at %s: %s", f.Rank, f.Host, f.NodeRank, f.How(), f.Time.Format("15:04:05.000"), first)
}

// writeFailureTable prints failures, first first, as one table; stopped
// counts the workers the agent stopped because of them.
func writeFailureTable(w io.Writer, failures []WorkerFailure, stopped int) {
	if len(failures) == 0 {
		return
	}
	first := failures[0]
	fmt.Fprintf(w, "gorun: worker failure (attempt %d): first failed rank %d on %s, %s\n", first.Attempt, first.Rank, first.Host, first.How())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RANK\tLOCAL\tHOST\tEXIT\tTIME\tERROR")
	for _, f := range failures {
		lines := strings.Split(strings.TrimRight(f.Error, "\n"), "\n")
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\n", f.Rank, f.LocalRank, f.Host, f.How(), f.Time.Format("15:04:05.000"), lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "  \t\t\t\t\t%s\n", l)
		}
	}
	tw.Flush()
	if stopped > 0 {
		fmt.Fprintf(w, "gorun: stopped the other %d worker(s) of this node\n", stopped)
	}
}

// readErrorFile returns the message a worker left in its
// TORCHELASTIC_ERROR_FILE, in torchrun's format:
//
//	{"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
//
// or {"message": "text"}. It returns "" when there is no readable file.
func readErrorFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	var doc struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(data, &doc) != nil || len(doc.Message) == 0 {
		return strings.TrimSpace(string(data))
	}
	var text string
	if json.Unmarshal(doc.Message, &text) == nil {
		return text
	}
	var nested struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
		} `json:"extraInfo"`
	}
	if json.Unmarshal(doc.Message, &nested) != nil {
		return string(doc.Message)
	}
	if nested.ExtraInfo.PyCallstack != "" {
		return nested.Message + "\n" + lastLines(nested.ExtraInfo.PyCallstack, 6)
	}
	return nested.Message
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
