package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/slurm"
)

// statusCommand is `gorun status`: a job's rendezvous, read without taking
// part in it.
func statusCommand() *cli.Command {
	return &cli.Command{
		Name:        "status",
		Usage:       "show a job's rendezvous (its run id's current incarnation; a finished one for a day): round, members, waiting nodes, restarts, recent failures",
		UsageText:   "gorun status --rdzv-endpoint HOST:PORT --rdzv-id ID   (inside a SLURM job: gorun status)",
		Description: statusDescription,
		Flags: []cli.Flag{
			stringFlag("", "rdzv-endpoint", "", "etcd HOST:PORT[,...] (default inside a SLURM job: its embedded etcd)"),
			stringFlag("", "rdzv-id", "", "run id (default: SLURM_JOB_ID)"),
			stringFlag("", "rdzv-conf", "", "TLS and auth: cacert, cert, key, user, password; connect_timeout"),
			stringFlag("", "job-secret-file", "", "file (mode 600) holding the job secret, for an etcd gorun runs with one (embedded, gorun rendezvous serve); else GORUN_JOB_SECRET"),
			&cli.BoolFlag{Name: "json", Usage: "print the whole status (every member, waiting node and failure) as one JSON object; fields below"},
			&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "show the status until Ctrl-C: redrawn every --interval on a terminal, else printed again (plain lines under a time line) each time it changes"},
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "how often --watch reads the status"},
		},
		Action: statusAction,
	}
}

func statusAction(c *cli.Context) error {
	job, underSLURM, err := slurm.FromEnv(os.LookupEnv)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	runID := c.String("rdzv-id")
	if runID == "" {
		runID = job.JobID
	}
	var endpoints []string
	for _, ep := range strings.Split(c.String("rdzv-endpoint"), ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			endpoints = append(endpoints, ep)
		}
	}
	if len(endpoints) == 0 && underSLURM {
		endpoints = launcher.PlanEmbedded(job.JobID, job.Nodes).Endpoints
	}
	if runID == "" || len(endpoints) == 0 {
		return cli.Exit("status: give --rdzv-endpoint and --rdzv-id (or run inside the SLURM job)", exitUsage)
	}
	conf, err := launcher.ParseRdzvConf(c.String("rdzv-conf"))
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if _, ok := conf[etcdstore.ConfConnectTimeout]; !ok {
		conf[etcdstore.ConfConnectTimeout] = "5s"
	}
	cfg, err := etcdstore.ClientConfigFromConf(endpoints, conf)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	secret, _, err := launcher.GivenSecret(os.LookupEnv, c.String("job-secret-file"))
	if err != nil {
		return cli.Exit("status: "+err.Error(), exitUsage)
	}
	if cfg, _, err = launcher.SecretCredentials(cfg, secret); err != nil {
		return cli.Exit("status: "+err.Error(), 1)
	}
	var watch *statusWatch
	if c.Bool("watch") {
		if c.Bool("json") {
			return cli.Exit("status: --watch and --json do not go together: --json is one report for scripts", exitUsage)
		}
		if watch, err = newStatusWatch(runID, c.App.Writer, c.Duration("interval")); err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
	}
	client, err := etcdstore.Dial(c.Context, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	if watch != nil {
		return watch.Run(c.Context, client)
	}
	st, err := etcdstore.ReadStatus(c.Context, client, runID)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(newStatusReport(st))
	}
	writeStatus(c.App.Writer, st, time.Now())
	if !st.Started {
		return cli.Exit("", 1)
	}
	return nil
}

// statusDescription is `gorun status --help`'s description: what the text
// shows and the --json fields, which scripts may rely on.
const statusDescription = `Reads the job's keys on its etcd without taking part in the job (no lease, no writes).
With --watch it reads them every --interval until Ctrl-C: redrawn on a terminal, else printed
again under a time line each time the status changed.

The text fits one screen whatever the job's size: the round, its phase and why it opened, the
budgets, the master, counts of members (alive, lost), agents and waiting nodes, then the members:
a table for up to 16 members (with each node's latest step, loss and tokens/s once its agent
published them), else their hosts as SLURM hostlists (node[0001-4096]) with the lost ones named,
the waiting nodes likewise, the stragglers, and the job's first failure with the latest ones.
Lists too long for one line end in "... N more": --json has them all.

--json prints one object:
  run_id, started, incarnation, generation (SLURM_RESTART_COUNT), exists (false: no round yet)
  round, phase (joinable, running, closed), since, result, reason, master_addr, master_port
  budgets: min_nodes, max_nodes, failure_restarts, max_failure_restarts,
           change_restarts, max_change_restarts
  counts: members, workers, alive, lost, registered, waiting, others, failures,
          in_place (in-place recoveries: membership changes whose workers were kept, not restarted;
          they still count in change_restarts, the budget they use)
  members: the round's members in node-rank order (none while it is joinable):
           node_rank, first_rank (global rank of its local rank 0), id, host, addr, nproc,
           since, alive (its agent's lease lives), progress (the node's latest heartbeat figures
           as its agent published them every 2 s: rank, step, loss, tokens_per_s of its rank
           that finished the newest step; absent when it published none)
  waiting: agents waiting for the next round: id, host, addr, nproc, since
  others:  agents with a live lease, neither members nor waiting: id, host, addr, nproc, since
  failures: every failure report, first first (the fields of the agents' reports)
  recoveries: every in-place recovery, first first: round, host (node rank 0 that recorded it),
           reason, lost (hosts), nodes, workers, at_step, steps_lost, seconds (round end to the
           first progress after it), time
  lost:    in_place_seconds, in_place_steps: the recoveries' seconds and steps_lost, summed
  stragglers: ranks whose median step compute (last 10 steps) is at least 1.5x the job's median,
           e.g. "rank 3 on node-b, 1.9x the median step compute"; the embedded trainer only
  goodput: the job's goodput as its agents published it (internal/goodput), in node-seconds
           summed over the nodes: measured (false before a step), ratio (effective over wall),
           wall_seconds = effective_seconds + lost_seconds + pending_seconds (since the last step),
           lost_by_cause (worker, node, network, straggler, restart), lost_by_phase (detection,
           rendezvous, state_transfer, first_step, redone_steps), lost (by cause, then phase),
           steps_redone, recoveries (the most any node saw), nodes (each node's own figures, host, at)`

// statusReport is a job's status as `gorun status` shows it, computed
// from what etcdstore.ReadStatus read; the text and the --json output are
// both made from it, and its JSON field names are the documented ones
// (statusDescription).
type statusReport struct {
	RunID       string               `json:"run_id"`
	Started     bool                 `json:"started"`
	Incarnation int                  `json:"incarnation"`
	Generation  int                  `json:"generation"`
	Exists      bool                 `json:"exists"`
	Round       int                  `json:"round"`
	Phase       rendezvous.Phase     `json:"phase,omitempty"`
	Since       time.Time            `json:"since"`
	Result      string               `json:"result,omitempty"`
	Reason      string               `json:"reason,omitempty"`
	MasterAddr  string               `json:"master_addr,omitempty"`
	MasterPort  int                  `json:"master_port,omitempty"`
	Budgets     statusBudgets        `json:"budgets"`
	Counts      statusCounts         `json:"counts"`
	Members     []statusMember       `json:"members"`
	Waiting     []statusNode         `json:"waiting"`
	Others      []statusNode         `json:"others"`
	Failures    []rendezvous.Failure `json:"failures"`
	// Recoveries are the in-place recoveries: rounds that kept the
	// workers instead of restarting them, first first.
	Recoveries []rendezvous.Recovery `json:"recoveries"`
	// Lost is what the in-place recoveries cost, in all.
	Lost statusLost `json:"lost"`
	// Stragglers are the ranks whose median step compute is at least
	// straggler.Factor times the job's, as the agents last published it
	// (embedded trainer only: other workers report no timing).
	Stragglers []string `json:"stragglers"`
	// Goodput is the job's goodput, from the figures its agents
	// published (package goodput).
	Goodput goodput.Job `json:"goodput"`
}

// statusBudgets are the job's node bounds and its two restart budgets,
// each as used and allowed.
type statusBudgets struct {
	MinNodes           int `json:"min_nodes"`
	MaxNodes           int `json:"max_nodes"`
	FailureRestarts    int `json:"failure_restarts"`
	MaxFailureRestarts int `json:"max_failure_restarts"`
	ChangeRestarts     int `json:"change_restarts"`
	MaxChangeRestarts  int `json:"max_change_restarts"`
}

// statusCounts are the sizes of the report's lists, and the workers of
// the round.
type statusCounts struct {
	Members    int `json:"members"`
	Workers    int `json:"workers"`
	Alive      int `json:"alive"`      // members whose agent's lease lives
	Lost       int `json:"lost"`       // members whose agent's lease is gone
	Registered int `json:"registered"` // agents with a live lease
	Waiting    int `json:"waiting"`
	Others     int `json:"others"`
	Failures   int `json:"failures"`
	InPlace    int `json:"in_place"` // in-place recoveries: not restarts
}

// statusLost is what the job's in-place recoveries cost in all, as the
// agents recorded them: the time from each round's end to the first step
// after it, and the steps they threw away.
type statusLost struct {
	InPlaceSeconds float64 `json:"in_place_seconds"`
	InPlaceSteps   int     `json:"in_place_steps"`
}

// statusNode is one agent as the report lists it.
type statusNode struct {
	ID    string    `json:"id"`
	Host  string    `json:"host"`
	Addr  string    `json:"addr"`
	NProc int       `json:"nproc"`
	Since time.Time `json:"since"`
}

// statusMember is one member of the round.
type statusMember struct {
	NodeRank  int `json:"node_rank"`
	FirstRank int `json:"first_rank"`
	statusNode
	Alive bool `json:"alive"`
	// Progress is the node's latest heartbeat figures as its agent last
	// published them (every 2 s): those of its rank that finished the
	// newest step. Nil when it published none (workers other than the
	// embedded trainer may report steps only, an older agent nothing).
	Progress *straggler.RankProgress `json:"progress,omitempty"`
}

func nodeOf(m rendezvous.Member) statusNode {
	return statusNode{ID: m.ID, Host: m.Host, Addr: m.Addr, NProc: m.NProc, Since: m.Since}
}

// newStatusReport computes the report of st. The members are the
// roster's when it is the current round's (running or closed), none while
// the round is joinable.
func newStatusReport(st etcdstore.Status) statusReport {
	s := st.State
	r := statusReport{
		RunID: st.RunID, Started: st.Started, Incarnation: st.Incarnation, Generation: st.Generation, Exists: st.Exists,
		Round: s.Round, Phase: s.Phase, Since: s.Since, Result: s.Result, Reason: s.Reason,
		Budgets: statusBudgets{
			MinNodes: s.Limits.MinNodes, MaxNodes: s.Limits.MaxNodes,
			FailureRestarts: s.Failures, MaxFailureRestarts: s.Limits.MaxFailures,
			ChangeRestarts: s.Changes, MaxChangeRestarts: s.Limits.MaxChanges,
		},
		Members: []statusMember{}, Waiting: []statusNode{}, Others: []statusNode{}, Failures: st.Failures,
	}
	if s.Phase == rendezvous.PhaseRunning {
		r.MasterAddr, r.MasterPort = s.MasterAddr, s.MasterPort
	}
	if r.Failures == nil {
		r.Failures = []rendezvous.Failure{}
	}
	alive := make(map[string]bool, len(st.Nodes))
	for _, n := range st.Nodes {
		alive[n.ID] = true
	}
	placed := map[string]bool{}
	if st.Exists && st.Roster.Round == s.Round {
		first := 0
		for i, m := range st.Roster.Members {
			r.Members = append(r.Members, statusMember{NodeRank: i, FirstRank: first, statusNode: nodeOf(m), Alive: alive[m.ID],
				Progress: latestOf(st.Stats[m.ID])})
			first += m.NProc
			placed[m.ID] = true
			if alive[m.ID] {
				r.Counts.Alive++
			}
		}
		r.Counts.Workers = first
	}
	for _, m := range st.Waiting {
		r.Waiting = append(r.Waiting, nodeOf(m))
		placed[m.ID] = true
	}
	for _, m := range st.Nodes {
		if !placed[m.ID] {
			r.Others = append(r.Others, nodeOf(m))
		}
	}
	r.Counts.Members = len(r.Members)
	r.Counts.Lost = r.Counts.Members - r.Counts.Alive
	r.Counts.Registered = len(st.Nodes)
	r.Counts.Waiting = len(r.Waiting)
	r.Counts.Others = len(r.Others)
	r.Counts.Failures = len(r.Failures)
	r.Recoveries = st.Recoveries
	if r.Recoveries == nil {
		r.Recoveries = []rendezvous.Recovery{}
	}
	r.Counts.InPlace = len(r.Recoveries)
	for _, rec := range r.Recoveries {
		r.Lost.InPlaceSeconds += rec.Seconds
		r.Lost.InPlaceSteps += rec.StepsLost
	}
	r.Stragglers = stragglersOf(st.Stats)
	r.Goodput = goodput.JobOfValues(st.Goodput)
	return r
}

// stragglersOf names the stragglers among the agents' published
// reports (see straggler.Find); a report that does not decode is left
// out.
func stragglersOf(stats map[string][]byte) []string {
	var reports []straggler.Report
	for _, v := range stats {
		if rep, err := straggler.ParseReport(v); err == nil {
			reports = append(reports, rep)
		}
	}
	names := []string{}
	for _, s := range straggler.Find(reports) {
		names = append(names, s.String())
	}
	return names
}

// latestOf is the latest figures in a node's published stats value (a
// straggler.Report), nil when it holds none or does not decode.
func latestOf(stats []byte) *straggler.RankProgress {
	rep, err := straggler.ParseReport(stats)
	if err != nil {
		return nil
	}
	if p, ok := rep.Latest(); ok {
		return &p
	}
	return nil
}

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

// writeStatus prints st for people, on one screen whatever the job's size
// (see statusDescription).
func writeStatus(w io.Writer, st etcdstore.Status, now time.Time) {
	if !st.Started {
		fmt.Fprintf(w, "run %s: no rendezvous on this etcd (no agent of this run id has started, or its keys expired)\n", st.RunID)
		return
	}
	run := fmt.Sprintf("run %s incarnation %d", st.RunID, st.Incarnation)
	if st.Generation > 0 {
		run += fmt.Sprintf(" (SLURM restart %d)", st.Generation)
	}
	if !st.Exists {
		fmt.Fprintf(w, "%s: starting, no round yet\n", run)
		return
	}
	r := newStatusReport(st)
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
func writeHeader(w io.Writer, r statusReport) {
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
func writeMembers(w io.Writer, r statusReport, ago func(time.Time) string) (elided bool) {
	if len(r.Members) <= tableMembers {
		if len(r.Members) > 0 {
			progress := slices.ContainsFunc(r.Members, func(m statusMember) bool { return m.Progress != nil })
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
func writeWaiting(w io.Writer, r statusReport, ago func(time.Time) string) (elided bool) {
	if len(r.Waiting) > listedWaiting {
		return writeHosts(w, "waiting", hostsOf(r.Waiting))
	}
	for _, m := range r.Waiting {
		fmt.Fprintf(w, "waiting: %s (%s, %d workers) since %s\n", m.Host, m.Addr, m.NProc, ago(m.Since))
	}
	return false
}

func hostsOf(nodes []statusNode) []string {
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
