package status

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/slurm"
)

// shownStragglers is how many stragglers gorun status lists.
const shownStragglers = 4

// writeStragglers prints one line per straggler, at most shownStragglers
// and a count of the rest.
func writeStragglers(w io.Writer, stragglers []string) {
	for i, s := range stragglers {
		if i == shownStragglers {
			fmt.Fprintf(w, "  ... %d more stragglers\n", len(stragglers)-shownStragglers)
			return
		}
		fmt.Fprintln(w, "straggler: "+s)
	}
}

// Bounds that keep gorun status's text on one screen whatever the job's
// size: at most about 40 lines of at most about 120 columns (a failure
// line may be longer: it names the worker and its error's first line).
const (
	tableMembers   = 16  // members listed one per line, in a table; more are summarized
	listedWaiting  = 4   // waiting nodes listed one per line; more are summarized
	hostlistColumn = 100 // the longest hostlist written on one line
)

// WriteJSON writes r to w as one indented JSON object (gorun status
// --json; its fields are Description's). It fails when writing does.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r for people, on one screen whatever the job's size
// (see Description), with times as ages at now. Write errors are not
// reported: the text is for a terminal.
func (r Report) WriteText(w io.Writer, now time.Time) {
	if !r.Started {
		fmt.Fprintf(w, "run %s: no rendezvous on this etcd (no agent of this run id has started, or its keys expired)\n", r.RunID)
		return
	}
	run := fmt.Sprintf("run %s incarnation %d", r.RunID, r.Incarnation)
	if r.Generation > 0 {
		run += fmt.Sprintf(" (SLURM restart %d)", r.Generation)
	}
	if !r.Exists {
		fmt.Fprintf(w, "%s: starting, no round yet\n", run)
		return
	}
	ago := func(t time.Time) string { return now.Sub(t).Round(time.Second).String() + " ago" }
	fmt.Fprintf(w, "%s: round %d %s since %s (%s)\n", run, r.Round, r.Phase, r.Since.Format("15:04:05"), ago(r.Since))
	writeHeader(w, r)
	elided := writeMembers(w, r, ago)
	elided = writeWaiting(w, r, ago) || elided
	writeStragglers(w, r.Stragglers)
	if len(r.Others) > 0 {
		label := "others not in the round"
		if r.Phase == rendezvous.PhaseJoinable {
			label = "registered, not waiting"
		}
		elided = writeHosts(w, label, hostsOf(r.Others)) || elided
	}
	writeFailures(w, r.Failures)
	if elided || len(r.Failures) > shownFailures {
		fmt.Fprintln(w, "all members, waiting nodes and failures: gorun status --json")
	}
}

// writeHeader prints the lines about the round after the first one: its
// result, why it opened, the budgets, the master and the counts.
func writeHeader(w io.Writer, r Report) {
	if r.Result != "" {
		fmt.Fprintf(w, "result: %s\n", r.Result)
	}
	if r.Reason != "" {
		fmt.Fprintf(w, "reason: %s\n", r.Reason)
	}
	b := r.Budgets
	fmt.Fprintf(w, "nodes: %d..%d; restarts used: %d of %d after worker failures, %d of %d after membership changes\n",
		b.MinNodes, b.MaxNodes, b.FailureRestarts, b.MaxFailureRestarts, b.ChangeRestarts, b.MaxChangeRestarts)
	if n := len(r.Recoveries); n > 0 {
		fmt.Fprintf(w, "in-place recoveries (workers kept, not restarted): %d; last: %s\n", n, r.Recoveries[n-1])
		fmt.Fprintf(w, "time lost in them: %.1f s (each round's end to its first step), %d steps redone\n",
			r.Lost.InPlaceSeconds, r.Lost.InPlaceSteps)
	}
	for _, l := range r.Goodput.Lines() {
		fmt.Fprintln(w, l)
	}
	if r.Phase == rendezvous.PhaseRunning {
		fmt.Fprintf(w, "master: %s:%d\n", r.MasterAddr, r.MasterPort)
	}
	c := r.Counts
	switch r.Phase {
	case rendezvous.PhaseJoinable:
		fmt.Fprintf(w, "members: none yet (round %d is joinable)\n", r.Round)
		fmt.Fprintf(w, "agents: %d with a live lease; %d waiting for the next round\n", c.Registered, c.Waiting)
		return
	case rendezvous.PhaseClosed:
		fmt.Fprintf(w, "members: %d nodes, %d workers; %d still registered\n", c.Members, c.Workers, c.Alive)
	default:
		fmt.Fprintf(w, "members: %d nodes, %d workers; %d alive, %d lost\n", c.Members, c.Workers, c.Alive, c.Lost)
	}
	fmt.Fprintf(w, "agents: %d with a live lease; %d waiting for the next round, %d others not in the round\n",
		c.Registered, c.Waiting, c.Others)
}

// writeMembers prints the round's members: a table when they are few,
// else their hosts and the lost ones as hostlists. It reports whether it
// left any out.
func writeMembers(w io.Writer, r Report, ago func(time.Time) string) (elided bool) {
	if len(r.Members) <= tableMembers {
		if len(r.Members) > 0 {
			progress := slices.ContainsFunc(r.Members, func(m Member) bool { return m.Progress != nil })
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			head := "NODE RANK\tHOST\tADDR\tWORKERS\tALIVE\tSINCE"
			if progress {
				head += "\tSTEP\tLOSS\tTOK/S"
			}
			fmt.Fprintln(tw, head)
			for _, m := range r.Members {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%v\t%s", m.NodeRank, m.Host, m.Addr, m.NProc, m.Alive, ago(m.Since))
				if progress {
					fmt.Fprint(tw, progressColumns(m.Progress))
				}
				fmt.Fprintln(tw)
			}
			tw.Flush()
			for _, m := range r.Members {
				if m.Snapshots != nil {
					fmt.Fprintf(w, "snapshots on %s: %s\n", m.Host, m.Snapshots)
				}
			}
		}
	} else {
		hosts := make([]string, 0, len(r.Members))
		var lost []string
		for _, m := range r.Members {
			hosts = append(hosts, m.Host)
			if !m.Alive {
				lost = append(lost, m.Host)
			}
		}
		elided = writeHosts(w, "member hosts", hosts)
		if r.Phase == rendezvous.PhaseRunning && len(lost) > 0 {
			elided = writeHosts(w, "lost", lost) || elided
		}
	}
	return elided
}

// progressColumns are a member's STEP, LOSS and TOK/S cells, each after a
// tab: "-" for a figure it did not publish.
func progressColumns(p *straggler.RankProgress) string {
	if p == nil {
		return "\t-\t-\t-"
	}
	loss, tok := "-", "-"
	if p.Loss != 0 {
		loss = fmt.Sprintf("%.3f", p.Loss)
	}
	if p.TokensPerS != 0 {
		tok = fmt.Sprintf("%.0f", p.TokensPerS)
	}
	return fmt.Sprintf("\t%d\t%s\t%s", p.Step, loss, tok)
}

// writeWaiting prints the waiting nodes, one a line when they are few,
// else as a hostlist. It reports whether it left any out.
func writeWaiting(w io.Writer, r Report, ago func(time.Time) string) (elided bool) {
	if len(r.Waiting) > listedWaiting {
		return writeHosts(w, "waiting", hostsOf(r.Waiting))
	}
	for _, m := range r.Waiting {
		fmt.Fprintf(w, "waiting: %s (%s, %d workers) since %s\n", m.Host, m.Addr, m.NProc, ago(m.Since))
	}
	return false
}

func hostsOf(nodes []Node) []string {
	hosts := make([]string, 0, len(nodes))
	for _, n := range nodes {
		hosts = append(hosts, n.Host)
	}
	return hosts
}

// writeHosts prints one line "label (N): HOSTLIST", the hosts sorted and
// compressed as a SLURM hostlist, cut to about hostlistColumn columns
// with "... N more". It reports whether it cut the list.
func writeHosts(w io.Writer, label string, hosts []string) (elided bool) {
	list, shown := shortHostlist(hosts, hostlistColumn)
	more := ""
	if shown < len(hosts) {
		more = fmt.Sprintf(" ... %d more", len(hosts)-shown)
	}
	fmt.Fprintf(w, "%s (%d): %s%s\n", label, len(hosts), list, more)
	return shown < len(hosts)
}

// shortHostlist sorts hosts (names with the same prefix by their trailing
// number) and compresses them as a SLURM hostlist of at most width bytes:
// the longest first part of the sorted hosts that fits, but at least one
// host. It returns the hostlist and how many hosts it holds.
func shortHostlist(hosts []string, width int) (string, int) {
	sorted := slices.Clone(hosts)
	slices.SortFunc(sorted, compareHosts)
	if list := slurm.CompressHostlist(sorted); len(list) <= width {
		return list, len(sorted)
	}
	// A hostlist of more hosts is rarely shorter: search the most that fit.
	n := sort.Search(len(sorted), func(k int) bool {
		return len(slurm.CompressHostlist(sorted[:k+1])) > width
	})
	n = max(n, 1)
	return slurm.CompressHostlist(sorted[:n]), n
}

// compareHosts orders host names by the text before their trailing
// number, then by that number's value (node9 before node10), then as
// plain strings.
func compareHosts(a, b string) int {
	ap, an := splitTrailingNumber(a)
	bp, bn := splitTrailingNumber(b)
	if c := strings.Compare(ap, bp); c != 0 {
		return c
	}
	an, bn = strings.TrimLeft(an, "0"), strings.TrimLeft(bn, "0")
	return cmp.Or(cmp.Compare(len(an), len(bn)), strings.Compare(an, bn), strings.Compare(a, b))
}

// splitTrailingNumber splits host into the text before its trailing
// decimal digits and those digits ("" when there are none).
func splitTrailingNumber(host string) (prefix, digits string) {
	i := len(host)
	for i > 0 && host[i-1] >= '0' && host[i-1] <= '9' {
		i--
	}
	return host[:i], host[i:]
}

// shownFailures is how many failures gorun status lists: the first, then
// the latest.
const shownFailures = 5

// writeFailures lists failures first first: always the job's first
// failure, then the latest others, saying how many are left out.
func writeFailures(w io.Writer, failures []rendezvous.Failure) {
	n := len(failures)
	if n == 0 {
		return
	}
	if n <= shownFailures {
		fmt.Fprintf(w, "failures (%d, first first):\n", n)
	} else {
		fmt.Fprintf(w, "failures (%d, first first; the first and the last %d):\n", n, shownFailures-1)
	}
	for i, f := range failures {
		if i > 0 && i < n-(shownFailures-1) {
			if i == 1 {
				fmt.Fprintf(w, "  ... %d more\n", n-shownFailures)
			}
			continue
		}
		fmt.Fprintf(w, "  round %d: %s\n", f.Attempt, f)
	}
}
