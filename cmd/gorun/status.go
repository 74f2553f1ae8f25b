package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/rendezvous/status"
	"github.com/gorun/gorun/slurm"
)

// statusCommand is `gorun status`: a job's rendezvous, read without taking
// part in it.
func statusCommand() *cli.Command {
	return &cli.Command{
		Name:        "status",
		Usage:       "show a job's rendezvous (its run id's current incarnation; a finished one for a day): round, members, waiting nodes, restarts, recent failures",
		UsageText:   "gorun status --rdzv-endpoint HOST:PORT --rdzv-id ID   (inside a SLURM job: gorun status)",
		Description: status.Description,
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
	var watch *status.Watch
	if c.Bool("watch") {
		if c.Bool("json") {
			return cli.Exit("status: --watch and --json do not go together: --json is one report for scripts", exitUsage)
		}
		if watch, err = newStatusWatch(runID, c.App.Writer, c.Duration("interval")); err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
	}
	conn, err := etcdstore.Connect(c.Context, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	read := func(ctx context.Context) (etcdstore.Status, error) { return conn.ReadStatus(ctx, runID) }
	if watch != nil {
		return runStatusWatch(c.Context, watch, read)
	}
	rep, err := status.Read(c.Context, read)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return rep.WriteJSON(c.App.Writer)
	}
	rep.WriteText(c.App.Writer, time.Now())
	if !rep.Started {
		return cli.Exit("", 1)
	}
	return nil
}
