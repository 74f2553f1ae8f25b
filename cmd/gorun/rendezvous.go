package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous/etcdembed"
)

// rendezvousCommand groups the commands about gorun's etcd rendezvous.
func rendezvousCommand() *cli.Command {
	return &cli.Command{
		Name:  "rendezvous",
		Usage: "run or inspect the etcd that gorun agents rendezvous through",
		Subcommands: []*cli.Command{
			rendezvousServeCommand(),
			// status: the lead's `gorun rendezvous status` goes here.
		},
	}
}

func rendezvousServeCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run an etcd v3 member for gorun agents (--rdzv-endpoint) until SIGTERM or SIGINT",
		UsageText: "gorun rendezvous serve --listen HOST:PORT --data-dir DIR [--peer-listen HOST:PORT] [--name N] [--initial-cluster NAME=HOST:PORT,...] [--job-secret-file FILE]\n" +
			"   with a job secret (GORUN_JOB_SECRET or --job-secret-file), it speaks only mutual TLS (a CA derived from the secret) and only agents holding it may read or write\n" +
			"   three members: run on each of a, b, c (same --initial-cluster)\n" +
			"   gorun rendezvous serve --name a --listen a:2379 --data-dir /var/lib/gorun-etcd --initial-cluster a=a:2380,b=b:2380,c=c:2380",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "HOST:PORT for clients; HOST is this node's address (a name is resolved to its first IPv4 address)"},
			&cli.StringFlag{Name: "data-dir", Usage: "DIR for etcd's data; kept on exit, so a restart resumes"},
			&cli.StringFlag{Name: "peer-listen", Usage: "HOST:PORT for the other members (default: the --listen host, port + 1; or this member's entry of --initial-cluster)"},
			&cli.StringFlag{Name: "name", Usage: "member name (default: the host name)"},
			&cli.StringFlag{Name: "initial-cluster", Usage: "NAME=HOST:PORT,... peer address of every member, this one included (default: this member alone)"},
			&cli.StringFlag{Name: "job-secret-file", Usage: "FILE (mode 600) holding the job secret, else GORUN_JOB_SECRET: etcd then lets in only agents holding it (every member needs the same one)"},
		},
		Action:          rendezvousServeAction,
		HideHelpCommand: true,
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			msg := err.Error()
			if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
				msg = "unknown flag --" + strings.TrimPrefix(name, "-") + " (gorun rendezvous serve --help lists the flags)"
			}
			return cli.Exit("rendezvous serve: "+msg, exitUsage)
		},
	}
}

// serveConfig builds the server configuration from the flags of c; any
// problem is a usage error.
func serveConfig(c *cli.Context) (etcdembed.Config, error) {
	if c.NArg() > 0 {
		return etcdembed.Config{}, fmt.Errorf("unexpected argument %q (all settings are flags)", c.Args().First())
	}
	cfg := etcdembed.Config{
		Name: c.String("name"), DataDir: c.String("data-dir"),
		ClientAddr: c.String("listen"), PeerAddr: c.String("peer-listen"),
	}
	if cfg.ClientAddr == "" {
		return cfg, errors.New("--listen HOST:PORT is required")
	}
	if cfg.DataDir == "" {
		return cfg, errors.New("--data-dir DIR is required")
	}
	if cfg.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			return cfg, fmt.Errorf("--name: no host name to default to: %w", err)
		}
		cfg.Name = host
	}
	if ic := c.String("initial-cluster"); ic != "" {
		cfg.InitialCluster = map[string]string{}
		for _, part := range strings.Split(ic, ",") {
			name, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || name == "" || addr == "" {
				return cfg, fmt.Errorf("--initial-cluster: %q is not NAME=HOST:PORT", part)
			}
			if _, dup := cfg.InitialCluster[name]; dup {
				return cfg, fmt.Errorf("--initial-cluster: member %q appears twice", name)
			}
			cfg.InitialCluster[name] = addr
		}
		if _, ok := cfg.InitialCluster[cfg.Name]; !ok {
			return cfg, fmt.Errorf("--initial-cluster has no member %q (this one: see --name)", cfg.Name)
		}
		if cfg.PeerAddr == "" {
			cfg.PeerAddr = cfg.InitialCluster[cfg.Name]
		}
	}
	if cfg.PeerAddr == "" {
		host, port, err := net.SplitHostPort(cfg.ClientAddr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 1 || n >= 65535 {
			return cfg, fmt.Errorf("--listen %q: want HOST:PORT with PORT 1-65534 (the peer port defaults to PORT+1)", cfg.ClientAddr)
		}
		cfg.PeerAddr = net.JoinHostPort(host, strconv.Itoa(n+1))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, errors.New(strings.TrimPrefix(err.Error(), "rendezvous: server: "))
	}
	secret, _, err := launcher.GivenSecret(os.LookupEnv, c.String("job-secret-file"))
	if err != nil {
		return cfg, err
	}
	cfg.Secret = secret
	return cfg, nil
}

func rendezvousServeAction(c *cli.Context) error {
	cfg, err := serveConfig(c)
	if err != nil {
		return cli.Exit("rendezvous serve: "+err.Error(), exitUsage)
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	cfg.Log = log
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	server, err := etcdembed.Start(ctx, cfg)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	auth := "no authentication: anyone who reaches it may read and change every key (give GORUN_JOB_SECRET or --job-secret-file)"
	if !cfg.Secret.IsZero() {
		auth = "mutual TLS and authentication: only for holders of the job secret (gorun job-secret --etcdctl DIR for etcdctl)"
	}
	for _, ep := range server.Endpoints() {
		fmt.Fprintf(c.App.Writer, "gorun rendezvous: serving etcd v3 at %s, %s\n", ep, auth)
	}
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info().Str("component", "rendezvous").Msg("stopping etcd")
	case err := <-server.Err():
		serveErr = fmt.Errorf("etcd stopped serving: %w", cmp.Or(err, errors.New("no reason given")))
	}
	if err := errors.Join(serveErr, server.Close()); err != nil {
		return cli.Exit(fmt.Sprintf("rendezvous serve: %v", err), 1)
	}
	return nil
}
