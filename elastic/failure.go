package elastic

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/gorun/gorun/rendezvous"
)

// writeFailureTable prints failures, first first, as one table; stopped
// counts the workers the agent stopped because of them.
func writeFailureTable(w io.Writer, failures []rendezvous.Failure, stopped int) {
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
