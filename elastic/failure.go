package elastic

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/filetimer"
	"github.com/gorun/gorun/rendezvous"
)

// Console limits of a failure's error text in the failure table: the
// whole text (up to rendezvous.MaxErrorBytes) is in etcd (gorun status
// --json) and the worker's own file stays on disk.
const (
	tableLines    = 5
	tableLineSize = 240
)

// failure is w's report as a failure of round r: how it ended (or, while
// it still runs, how the agent is about to end it: signal) and what it
// said.
func (a *Agent) failure(w *worker, r rendezvous.Round, signal syscall.Signal) rendezvous.Failure {
	res := w.process.Result()
	f := rendezvous.Failure{
		Host: a.spec.Host, NodeRank: w.contract.GroupRank, Rank: w.contract.Rank,
		LocalRank: w.contract.LocalRank, PID: w.process.PID(), ExitCode: res.ExitCode,
		Time: res.Ended, Attempt: r.Number,
	}
	if res.Ended.IsZero() { // not reaped yet: blamed before the kill
		f.ExitCode, f.Time, res.Signal = 128+int(signal), time.Now(), signal
	}
	if res.Signal != 0 {
		f.Signal = unix.SignalName(res.Signal)
	}
	var msg string
	msg, f.LostPeer = readErrorFile(w.contract.ErrorFile)
	if msg == "" && w.started.ErrorFile != w.contract.ErrorFile { // a kept worker may still use its first one
		msg, f.LostPeer = readErrorFile(w.started.ErrorFile)
	}
	if msg == "" {
		msg = lastLines(strings.Join(w.logs.Tail(), "\n"), 5)
	}
	if e, ok := a.timedOut.Load(res.PID); ok {
		msg = strings.TrimSpace(fmt.Sprintf("watchdog timer %q expired (TORCHELASTIC_TIMER_FILE)\n%s", e.(filetimer.Expiry).Scope, msg))
	}
	switch h := w.health.load(); {
	case (h == judged || h == suspect) && w.stall != nil:
		what := "; stack dump requested (SIGQUIT)"
		if h == suspect {
			what = "; the process was stopped or stuck in the kernel"
		}
		msg = strings.TrimSpace(w.stall.String() + what + "\n" + msg)
		f.LostPeer = nil // blamed for the hang, not a victim of a lost peer
	case h == abandoned:
		aw := w.await
		msg = strings.TrimSpace(fmt.Sprintf("awaited a new round for %s after step %d (its world broke, lost peer %d): none came\n%s",
			a.spec.AwaitTimeout, aw.Step, aw.LostPeer, msg))
		if aw.LostPeer >= 0 {
			peer := aw.LostPeer
			f.LostPeer = &peer
		}
	}
	if msg == "" {
		msg = "(no error file, no stderr output)"
	}
	f.Error = rendezvous.CutError(msg, rendezvous.MaxErrorBytes, "")
	return f
}

// failures reports the workers of ended that failed (the agent had not
// signalled them), in the order this node reaped them.
func (a *Agent) failures(ended []*worker, r rendezvous.Round) []rendezvous.Failure {
	var out []rendezvous.Failure
	for _, w := range ended {
		if w.process.Result().Success() {
			continue
		}
		out = append(out, a.failure(w, r, 0))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// writeFailureTable prints failures, first first, as one table, each
// error cut to a few lines; stopped counts the workers the agent stopped
// because of them.
func writeFailureTable(w io.Writer, failures []rendezvous.Failure, stopped int) {
	if len(failures) == 0 {
		return
	}
	first := failures[0]
	fmt.Fprintf(w, "gorun: worker failure (attempt %d): first failed rank %d on %s, %s\n", first.Attempt, first.Rank, first.Host, first.How())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RANK\tLOCAL\tHOST\tEXIT\tTIME\tERROR")
	for _, f := range failures {
		lines := consoleLines(f.Error)
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

// consoleLines is text as at most tableLines lines of at most
// tableLineSize bytes, saying what was left out.
func consoleLines(text string) []string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	var out []string
	for i, l := range lines {
		if i == tableLines {
			out = append(out, fmt.Sprintf("[%d more lines: gorun status --json, or the error file]", len(lines)-i))
			break
		}
		if len(l) > tableLineSize {
			l = strings.ToValidUTF8(l[:tableLineSize], "") + fmt.Sprintf(" [%d more bytes]", len(l)-tableLineSize)
		}
		out = append(out, l)
	}
	return out
}

// maxErrorFile bounds how much of a worker's error file is read.
const maxErrorFile = 16 << 20

// readErrorFile returns the message a worker left in its
// TORCHELASTIC_ERROR_FILE, in torchrun's format:
//
//	{"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
//
// or {"message": "text"}, cut to rendezvous.MaxErrorBytes with a note
// naming the file, and the peer rank whose loss it names ("lost_peer": 3,
// written by the embedded trainer). It returns "" when there is no
// readable file.
func readErrorFile(path string) (string, *int) {
	file, err := os.Open(path)
	if err != nil {
		return "", nil
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, maxErrorFile))
	if err != nil || len(data) == 0 {
		return "", nil
	}
	msg, lostPeer := parseErrorFile(data)
	return rendezvous.CutError(msg, rendezvous.MaxErrorBytes, path), lostPeer
}

// parseErrorFile reads the message and lost peer of an error file's data.
func parseErrorFile(data []byte) (string, *int) {
	var doc struct {
		Message  json.RawMessage `json:"message"`
		LostPeer *int            `json:"lost_peer"`
	}
	if json.Unmarshal(data, &doc) != nil || len(doc.Message) == 0 {
		return strings.TrimSpace(string(data)), nil
	}
	var text string
	if json.Unmarshal(doc.Message, &text) == nil {
		return text, doc.LostPeer
	}
	var nested struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
		} `json:"extraInfo"`
	}
	if json.Unmarshal(doc.Message, &nested) != nil {
		return string(doc.Message), doc.LostPeer
	}
	if nested.ExtraInfo.PyCallstack != "" {
		return nested.Message + "\n" + lastLines(nested.ExtraInfo.PyCallstack, 6), doc.LostPeer
	}
	return nested.Message, doc.LostPeer
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// firstLine is the first line of s.
func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}
