package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// roundCase is one row of the round-time table.
type roundCase struct {
	Agents   int
	Limits   rendezvous.Limits
	LastCall time.Duration // 0: MinNodes = MaxNodes = Agents, no last call
}

// roundResult is one repetition of a roundCase.
type roundResult struct {
	Setup   time.Duration // Dial + session + Join of every agent (not part of the round time)
	Round   time.Duration // start of Next on all agents to the last member's Round
	Members int
	Counts  *storeCounts
}

func roundsCmd(ctx context.Context, args []string) error {
	fs := newFlags("rounds")
	endpoint := fs.String("endpoint", "", "etcd client endpoint")
	agentsFlag := fs.String("agents", "8,64,256", "agent counts, comma-separated")
	runs := fs.Int("runs", 5, "repetitions of each case (fresh run id each)")
	lastCall := fs.Duration("last-call", time.Second, "last call of the elastic (MIN<MAX) rows")
	ttl := fs.Duration("ttl", 5*time.Second, "lease TTL of each agent's session")
	goal := fs.Duration("goal", 2*time.Second, "goal: the largest count forms a round within this beyond the last call")
	maxWait := fs.Duration("max-wait", 30*time.Second, "a run fails when the round has not formed this long after Next began")
	caseBudget := fs.Duration("case-budget", 40*time.Second, "start no further run of a case once it has taken this long")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole command here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *endpoint == "" || *runs < 1 {
		return errors.New("-endpoint is required and -runs must be at least 1")
	}
	var counts []int
	for _, f := range strings.Split(*agentsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-agents %q: want counts of at least 2", *agentsFlag)
		}
		counts = append(counts, n)
	}
	var cases []roundCase
	for _, n := range counts {
		cases = append(cases,
			roundCase{Agents: n, Limits: rendezvous.Limits{MinNodes: n, MaxNodes: n}},
			roundCase{Agents: n, Limits: rendezvous.Limits{MinNodes: n / 2, MaxNodes: 2 * n}, LastCall: *lastCall})
	}
	fmt.Printf("== part 1: round time, N agents as goroutines in one process (own etcd client, lease and watch each) against one etcd at %s\n", *endpoint)
	fmt.Printf("   time from the start of Next on every agent to the moment every member has its Round; up to %d runs each (a case stops at its first failure or after %s), fresh run id, median\n", *runs, *caseBudget)
	fmt.Printf("   N:N freezes as the N-th joins; N/2:2N waits for the last call (%s) once N/2 joined: beyond = median - last call\n", *lastCall)
	fmt.Printf("   lease TTL %s; a run fails when an agent's session is lost or no round forms within %s\n\n", *ttl, *maxWait)

	const header = "   %6s %9s %6s %7s %10s %10s %10s %10s %9s %11s %9s\n"
	fmt.Printf(header, "agents", "MIN:MAX", "l.call", "ok/runs", "median ms", "min ms", "max ms", "beyond ms", "setup ms", "events/agt", "CAS KiB")
	goalAgents := counts[len(counts)-1]
	goalLine := fmt.Sprintf("goal: %d agents form a round in under %s beyond the last call: MISSED (no run of %d agents formed a round)", goalAgents, *goal, goalAgents)
	for _, c := range cases {
		var rounds, setups []time.Duration
		var events, casBytes []int64
		var failures []string
		tried, caseStart := 0, time.Now()
		for i := 0; i < *runs && len(failures) == 0 && (i == 0 || time.Since(caseStart) < *caseBudget); i++ {
			tried++
			r, err := roundOnce(ctx, *endpoint, c, *ttl, *maxWait, i)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failures = append(failures, fmt.Sprintf("run %d: %v", i, err))
				continue
			}
			rounds, setups = append(rounds, r.Round), append(setups, r.Setup)
			events, casBytes = append(events, r.Counts.Events.Load()), append(casBytes, r.Counts.CASBytes.Load())
		}
		lc, beyond := "-", "-"
		st := summarize(rounds)
		if c.LastCall > 0 {
			lc = c.LastCall.String()
			if st.N > 0 {
				beyond = ms(st.Median - c.LastCall)
			}
		}
		row := []any{strconv.Itoa(c.Agents), fmt.Sprintf("%d:%d", c.Limits.MinNodes, c.Limits.MaxNodes), lc, fmt.Sprintf("%d/%d", st.N, tried)}
		if st.N > 0 {
			row = append(row, ms(st.Median), ms(st.Min), ms(st.Max), beyond, ms(summarize(setups).Median),
				strconv.FormatInt(medianInt(events)/int64(c.Agents), 10), strconv.FormatInt(medianInt(casBytes)>>10, 10))
		} else {
			row = append(row, "-", "-", "-", "-", "-", "-", "-")
		}
		fmt.Printf(header, row...)
		for _, f := range failures {
			fmt.Printf("          %s\n", f)
		}
		if c.Agents == goalAgents && c.LastCall > 0 && st.N > 0 {
			b := st.Median - c.LastCall
			goalLine = fmt.Sprintf("goal: %d agents form a round in under %s beyond the last call: %s (median %s ms beyond, %d:%d)",
				goalAgents, *goal, verdict(b < *goal && len(failures) == 0), ms(b), c.Limits.MinNodes, c.Limits.MaxNodes)
			if len(failures) > 0 {
				goalLine += "; a run failed"
			}
		}
	}
	fmt.Printf("\n   events/agt: watch events each agent's view received (median run); CAS KiB: compare-and-swap payload all agents sent\n")
	fmt.Printf("\n%s\n\n", goalLine)
	return nil
}

// medianInt is the median of v (0 when empty).
func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchAgent is one in-process agent: its own client, session and view.
type benchAgent struct {
	client *clientv3.Client
	rdzv   *rendezvous.Elastic
}

func (a *benchAgent) close() {
	if a.rdzv != nil {
		_ = a.rdzv.Close()
	}
	if a.client != nil {
		_ = a.client.Close()
	}
}

// roundOnce starts c.Agents agents of a fresh job, lets all of them call
// Next at once and returns how long until every member had its Round.
// Agents left out of the round (MIN<MAX, joined after the freeze) are
// stopped once the members are done.
func roundOnce(ctx context.Context, endpoint string, c roundCase, ttl, maxWait time.Duration, rep int) (res roundResult, err error) {
	runID := fmt.Sprintf("bench-rounds-%d-%d-%d-%d", c.Agents, c.Limits.MaxNodes, rep, time.Now().UnixNano())
	agents := make([]*benchAgent, c.Agents)
	counts := &storeCounts{}
	res.Counts = counts
	defer func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for _, a := range agents {
			if a == nil {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				a.close()
			}()
		}
		wg.Wait()
	}()

	setupStart := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range agents {
		g.Go(func() error {
			cli, err := etcdstore.Dial(gctx, etcdstore.ClientConfig{Endpoints: []string{endpoint}, Patience: 10 * time.Second})
			if err != nil {
				return err
			}
			a := &benchAgent{client: cli}
			agents[i] = a
			store, err := etcdstore.New(gctx, cli, etcdstore.Incarnation{RunID: runID}, ttl)
			if err != nil {
				return err
			}
			id := fmt.Sprintf("agent-%04d", i)
			a.rdzv, err = rendezvous.Join(gctx, countingStore{store, counts}, rendezvous.Config{
				Self:     rendezvous.Member{ID: id, Host: id, Addr: "127.0.0.1", Preferred: -1, NProc: 1},
				Limits:   c.Limits,
				LastCall: c.LastCall, JoinTimeout: c.LastCall + time.Minute,
				FreePort: freePort, Log: zerolog.Nop(),
			})
			if err != nil {
				_ = store.Close()
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("start agents: %w", err)
	}
	res.Setup = time.Since(setupStart)

	nextCtx, stopNext := context.WithTimeoutCause(ctx, maxWait, fmt.Errorf("no round within -max-wait=%s", maxWait))
	defer stopNext()
	type got struct {
		round rendezvous.Round
		at    time.Time
		err   error
	}
	results := make(chan got, len(agents))
	start := make(chan struct{})
	for _, a := range agents {
		go func() {
			<-start
			r, err := a.rdzv.Next(nextCtx)
			results <- got{r, time.Now(), err}
		}()
	}
	t0 := time.Now()
	close(start)

	// Every Next returns before the agents are closed (deferred above).
	var last time.Time
	var first rendezvous.Round
	var failed error
	ranks := map[int]bool{}
	stopped := false
	for range agents {
		r := <-results
		switch {
		case stopped:
			continue // left out of the round, or after a failure: stopped by us
		case r.err != nil:
			failed = fmt.Errorf("%w, %s after Next began (%d members had their round; setup took %s; %s)",
				r.err, r.at.Sub(t0).Round(time.Millisecond), len(ranks), res.Setup.Round(time.Millisecond), counts)
			stopped = true
			stopNext()
			continue
		}
		if len(ranks) == 0 {
			first = r.round
		}
		if r.round.Number != first.Number || r.round.NumNodes != first.NumNodes || r.round.MasterPort != first.MasterPort || ranks[r.round.NodeRank] {
			failed = fmt.Errorf("inconsistent rounds: %+v and %+v (ranks so far %d)", first, r.round, len(ranks))
			stopped = true
			stopNext()
			continue
		}
		ranks[r.round.NodeRank] = true
		if r.at.After(last) {
			last = r.at
		}
		if len(ranks) == first.NumNodes {
			stopped = true
			stopNext() // the agents still waiting were left out
		}
	}
	if failed != nil {
		return res, fmt.Errorf("%w; %s", failed, liveLeases(ctx, endpoint))
	}
	if len(ranks) != first.NumNodes {
		return res, fmt.Errorf("%d of %d members got their round", len(ranks), first.NumNodes)
	}
	res.Round, res.Members = last.Sub(t0), first.NumNodes
	return res, nil
}

// liveLeases says how many leases etcd holds now: after a lost session,
// fewer than the agents means etcd itself expired leases (no keep-alive
// reached it within the TTL).
func liveLeases(ctx context.Context, endpoint string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: []string{endpoint}, Patience: 5 * time.Second})
	if err != nil {
		return "leases: " + err.Error()
	}
	defer cli.Close()
	resp, err := cli.Leases(ctx)
	if err != nil {
		return "leases: " + err.Error()
	}
	return fmt.Sprintf("etcd holds %d leases", len(resp.Leases))
}
