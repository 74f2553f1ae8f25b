package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/slurm"
)

// statusCommand is `gorun status`: a job's rendezvous, read without taking
// part in it.
func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show a job's rendezvous (its run id's current incarnation; a finished one for a day): round, members, waiting nodes, restarts, recent failures",
		UsageText: "gorun status --rdzv-endpoint HOST:PORT --rdzv-id ID   (inside a SLURM job: gorun status)",
		Flags: []cli.Flag{
			stringFlag("", "rdzv-endpoint", "", "etcd HOST:PORT[,...] (default inside a SLURM job: its embedded etcd)"),
			stringFlag("", "rdzv-id", "", "run id (default: SLURM_JOB_ID)"),
			stringFlag("", "rdzv-conf", "", "TLS and auth: cacert, cert, key, user, password; connect_timeout"),
			stringFlag("", "job-secret-file", "", "file (mode 600) holding the job secret, for an etcd gorun runs with one (embedded, gorun rendezvous serve); else GORUN_JOB_SECRET"),
			&cli.BoolFlag{Name: "json", Usage: "print the status as one JSON object"},
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
	cfg, _ = launcher.SecretCredentials(cfg, secret)
	client, err := etcdstore.Dial(c.Context, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	st, err := etcdstore.ReadStatus(c.Context, client, runID)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	writeStatus(c.App.Writer, st, time.Now())
	if !st.Started {
		return cli.Exit("", 1)
	}
	return nil
}

// writeStatus prints st for people.
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
	s := st.State
	ago := func(t time.Time) string { return now.Sub(t).Round(time.Second).String() + " ago" }
	fmt.Fprintf(w, "%s: round %d %s since %s (%s)\n", run, s.Round, s.Phase, s.Since.Format("15:04:05"), ago(s.Since))
	if s.Result != "" {
		fmt.Fprintf(w, "result: %s\n", s.Result)
	}
	if s.Reason != "" {
		fmt.Fprintf(w, "reason: %s\n", s.Reason)
	}
	fmt.Fprintf(w, "nodes: %d..%d; restarts used: %d of %d after worker failures, %d of %d after membership changes\n",
		s.Limits.MinNodes, s.Limits.MaxNodes, s.Failures, s.Limits.MaxFailures, s.Changes, s.Limits.MaxChanges)
	if s.Phase == rendezvous.PhaseRunning {
		fmt.Fprintf(w, "master: %s:%d\n", s.MasterAddr, s.MasterPort)
	}
	alive := map[string]bool{}
	for _, n := range st.Nodes {
		alive[n.ID] = true
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE RANK\tHOST\tADDR\tWORKERS\tALIVE\tSINCE")
	var members []rendezvous.Member
	if st.Roster.Round == s.Round {
		members = st.Roster.Members
	}
	for i, m := range members {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%v\t%s\n", i, m.Host, m.Addr, m.NProc, alive[m.ID], ago(m.Since))
	}
	tw.Flush()
	for _, m := range st.Waiting {
		fmt.Fprintf(w, "waiting: %s (%s, %d workers) since %s\n", m.Host, m.Addr, m.NProc, ago(m.Since))
	}
	writeFailures(w, st.Failures)
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
