package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// roundCase is one row of the round-time table.
type roundCase struct {
	Agents   int
	Limits   limits
	LastCall time.Duration // 0: MIN = MAX = Agents, no last call
}

// roundResult is one repetition of a roundCase, as far as it got.
type roundResult struct {
	Setup   time.Duration // dial + session + Join of every agent (not part of the round time)
	Round   time.Duration // start of Next on all agents to the last member's Round
	Members int
	Counts  *storeCounts
	Events  perAgent // watch events delivered to each agent, Join to round formed (or failed)
	Lists   perAgent // lists of the job's keys by each agent, likewise
	Watches perAgent // watches opened by each agent, likewise
	// The etcd's cost: CPU seconds from the first dial to the round formed
	// (EtcdCPU) and during Next only (EtcdCPUNext); -1 when unknown.
	EtcdCPU, EtcdCPUNext float64
	DB                   etcdStatus // after the round formed, before the agents left
	DBGrowth             int64      // DBInUseBytes after minus before the case; -1: unknown
}

// perAgent is the mean, median and max of one count over agents. The
// median is the typical agent's: the aggregator, which follows every
// key of the job, is in the mean and the max.
type perAgent struct {
	Mean   float64
	Median int64
	Max    int64
}

// perAgentOf summarizes count over agents (nil agents count 0).
func perAgentOf(agents []*agent, count func(*viewCounts) int64) perAgent {
	var p perAgent
	if len(agents) == 0 {
		return p
	}
	var sum int64
	all := make([]int64, 0, len(agents))
	for _, a := range agents {
		var n int64
		if a != nil {
			n = count(a.view)
		}
		all = append(all, n)
		sum += n
		p.Max = max(p.Max, n)
	}
	slices.Sort(all)
	p.Median = all[len(all)/2]
	p.Mean = math.Round(float64(sum)/float64(len(agents))*10) / 10
	return p
}

// roundsFlags are the knobs of the rounds command.
type roundsFlags struct {
	endpoint              string
	runs, etcdPID         int
	lastCall, ttl, goal   time.Duration
	maxWait, setupTimeout time.Duration
	caseBudget            time.Duration
	json                  bool
}

func roundsCmd(ctx context.Context, args []string) error {
	fs := newFlags("rounds")
	var f roundsFlags
	fs.StringVar(&f.endpoint, "endpoint", "", "etcd client endpoint")
	agentsFlag := fs.String("agents", "8,64,256", "agent counts, comma-separated")
	fs.IntVar(&f.runs, "runs", 5, "repetitions of each case (fresh run id each)")
	fs.DurationVar(&f.lastCall, "last-call", time.Second, "last call of the elastic (MIN<MAX) rows")
	fs.DurationVar(&f.ttl, "ttl", 5*time.Second, "lease TTL of each agent's session")
	fs.DurationVar(&f.goal, "goal", 2*time.Second, "goal: the largest count forms a round within this beyond the last call")
	fs.DurationVar(&f.maxWait, "max-wait", 30*time.Second, "a run fails when the round has not formed this long after Next began")
	fs.DurationVar(&f.setupTimeout, "setup-timeout", 3*time.Minute, "a run fails when its agents have not all joined within this")
	fs.DurationVar(&f.caseBudget, "case-budget", 40*time.Second, "start no further run of a case once it has taken this long")
	fs.IntVar(&f.etcdPID, "etcd-pid", 0, "pid of the etcd server process, for its CPU time (0: not reported)")
	fs.BoolVar(&f.json, "json", false, "also print each case as one JSON line")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole command here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.endpoint == "" || f.runs < 1 || f.etcdPID < 0 {
		return errors.New("-endpoint is required, -runs must be at least 1 and -etcd-pid not negative")
	}
	counts, err := parseCounts(*agentsFlag)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	meter, err := newEtcdMeter(ctx, f.endpoint, f.etcdPID)
	if err != nil {
		return err
	}
	defer meter.close()

	var cases []roundCase
	for _, n := range counts {
		cases = append(cases,
			roundCase{Agents: n, Limits: limits{Min: n, Max: n}},
			roundCase{Agents: n, Limits: limits{Min: n / 2, Max: 2 * n}, LastCall: f.lastCall})
	}
	fmt.Printf("== part 1: round time, N agents as goroutines in one process (own etcd client, lease and watch each) against one etcd at %s\n", f.endpoint)
	fmt.Printf("   time from the start of Next on every agent to the moment every member has its Round; up to %d runs each (a case stops at its first failure or after %s), fresh run id, median\n", f.runs, f.caseBudget)
	fmt.Printf("   N:N freezes as the N-th joins; N/2:2N waits for the last call (%s) once N/2 joined: beyond = median - last call\n", f.lastCall)
	fmt.Printf("   lease TTL %s; a run fails when an agent's session is lost, the agents have not joined within %s, or no round forms within %s\n\n", f.ttl, f.setupTimeout, f.maxWait)

	const header = "   %6s %9s %6s %7s %9s %9s %9s %9s %8s %9s %8s %7s %7s %8s %7s\n"
	fmt.Printf(header, "agents", "MIN:MAX", "l.call", "ok/runs", "median ms", "min ms", "max ms", "beyond ms", "setup s",
		"evt/agt", "evt max", "lists", "watches", "etcd cpu", "db MiB")
	goalAgents := counts[len(counts)-1]
	goalLine := fmt.Sprintf("goal: %d agents form a round in under %s beyond the last call: MISSED (no run of %d agents formed a round)", goalAgents, f.goal, goalAgents)
	var jsonLines, mdRows []string
	for _, c := range cases {
		results, failures, err := runRoundCase(ctx, f, c)
		if err != nil {
			return err
		}
		row, js, md := roundRow(c, results, len(failures))
		mdRows = append(mdRows, md)
		fmt.Printf(header, row...)
		for _, fl := range failures {
			fmt.Printf("          %s\n", fl)
		}
		jsonLines = append(jsonLines, js)
		if st := summarize(okRounds(results)); c.Agents == goalAgents && c.LastCall > 0 && st.N > 0 {
			b := st.Median - c.LastCall
			goalLine = fmt.Sprintf("goal: %d agents form a round in under %s beyond the last call: %s (median %s ms beyond, %d:%d)",
				goalAgents, f.goal, verdict(b < f.goal && len(failures) == 0), ms(b), c.Limits.Min, c.Limits.Max)
			if len(failures) > 0 {
				goalLine += "; a run failed"
			}
		}
	}
	fmt.Printf("\n   evt/agt, evt max: watch events delivered to each agent from its Join to the round formed (or the run failed), mean and max over agents, median run\n")
	fmt.Printf("   lists, watches: key listings and watches opened per agent, mean / median agent (the aggregator lists and watches the whole job; the others follow %d keys each, a list and a watch per key); etcd cpu: CPU seconds of the etcd process from the first dial to the round formed; db: etcd's database size then\n", designKeys)
	fmt.Printf("\n%s\n\n", goalLine)
	fmt.Println("| agents | MIN:MAX | formed | median | beyond last call | watch events per agent (mean / max) | etcd CPU | etcd db |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range mdRows {
		fmt.Println(r)
	}
	fmt.Println()
	if f.json {
		for _, l := range jsonLines {
			fmt.Println(l)
		}
		fmt.Println()
	}
	return nil
}

// designKeys is how many keys an agent that is not the aggregator follows
// (docs/design.md, rendezvous/agentview.go): with a list and a watch each, its
// lists and watches per round. bench/rendezvous.sh's smoke fails when the
// median agent lists or watches more.
const designKeys = 3

// parseCounts parses a comma-separated list of agent counts (each >= 2).
func parseCounts(list string) ([]int, error) {
	var counts []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return nil, fmt.Errorf("-agents %q: want counts of at least 2", list)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// startCPUProfile profiles this process into path until the returned
// function is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// runRoundCase runs c up to f.runs times; it stops at the first failed
// run or once the case has taken f.caseBudget. It returns every run's
// result (failed ones too, for their counts) and the failures; an error
// only when ctx ended.
func runRoundCase(ctx context.Context, f roundsFlags, c roundCase) ([]roundResult, []string, error) {
	var results []roundResult
	var failures []string
	caseStart := time.Now()
	for i := 0; i < f.runs && len(failures) == 0 && (i == 0 || time.Since(caseStart) < f.caseBudget); i++ {
		r, err := roundOnce(ctx, f, c, i)
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("run %d: %v", i, err))
			r.Round = 0 // not formed
		}
		results = append(results, r)
	}
	return results, failures, nil
}

// okRounds are the round times of the runs that formed a round.
func okRounds(results []roundResult) []time.Duration {
	var d []time.Duration
	for _, r := range results {
		if r.Round > 0 {
			d = append(d, r.Round)
		}
	}
	return d
}

// roundJSON is one case of the rounds table as a JSON line.
type roundJSON struct {
	Part              string   `json:"part"`
	Agents            int      `json:"agents"`
	MinMax            string   `json:"min_max"`
	LastCallMS        int64    `json:"last_call_ms"`
	OK                int      `json:"ok"`
	Runs              int      `json:"runs"`
	MedianMS          *float64 `json:"median_ms"`
	BeyondMS          *float64 `json:"beyond_ms"`
	SetupMS           float64  `json:"setup_ms"`
	EventsPerAgent    float64  `json:"events_per_agent"`
	EventsPerAgentMax int64    `json:"events_per_agent_max"`
	ListsPerAgent     float64  `json:"lists_per_agent"`
	ListsMedian       int64    `json:"lists_per_agent_median"`
	WatchesPerAgent   float64  `json:"watches_per_agent"`
	WatchesMedian     int64    `json:"watches_per_agent_median"`
	DesignKeys        int      `json:"design_keys"` // what each agent but the aggregator may list and watch
	EtcdCPUS          float64  `json:"etcd_cpu_s"`
	EtcdCPUNextS      float64  `json:"etcd_cpu_next_s"`
	EtcdDBBytes       int64    `json:"etcd_db_bytes"`
	EtcdDBInUseBytes  int64    `json:"etcd_db_in_use_bytes"`
	EtcdDBGrowthBytes int64    `json:"etcd_db_growth_bytes"`
}

// roundRow renders the results of case c as a table row, a JSON line and
// a markdown row.
// Counts and costs are those of the median run by round time (of the
// failed run when none formed).
func roundRow(c roundCase, results []roundResult, failed int) ([]any, string, string) {
	formed := okRounds(results)
	st := summarize(formed)
	lc := "-"
	if c.LastCall > 0 {
		lc = c.LastCall.String()
	}
	j := roundJSON{Part: "rounds", Agents: c.Agents, MinMax: fmt.Sprintf("%d:%d", c.Limits.Min, c.Limits.Max),
		LastCallMS: c.LastCall.Milliseconds(), OK: st.N, Runs: len(results)}
	row := []any{strconv.Itoa(c.Agents), j.MinMax, lc, fmt.Sprintf("%d/%d", st.N, len(results))}
	if st.N > 0 {
		med := msFloat(st.Median)
		j.MedianMS = &med
		beyond := "-"
		if c.LastCall > 0 {
			b := msFloat(st.Median - c.LastCall)
			j.BeyondMS, beyond = &b, ms(st.Median-c.LastCall)
		}
		row = append(row, ms(st.Median), ms(st.Min), ms(st.Max), beyond)
	} else {
		row = append(row, "-", "-", "-", "-")
	}
	r := medianRun(results)
	j.SetupMS = msFloat(r.Setup)
	j.EventsPerAgent, j.EventsPerAgentMax, j.ListsPerAgent = r.Events.Mean, r.Events.Max, r.Lists.Mean
	j.ListsMedian, j.WatchesPerAgent, j.WatchesMedian, j.DesignKeys = r.Lists.Median, r.Watches.Mean, r.Watches.Median, designKeys
	j.EtcdCPUS, j.EtcdCPUNextS = r.EtcdCPU, r.EtcdCPUNext
	j.EtcdDBBytes, j.EtcdDBInUseBytes, j.EtcdDBGrowthBytes = r.DB.DBBytes, r.DB.DBInUseBytes, r.DBGrowth
	row = append(row, fmt.Sprintf("%.1f", r.Setup.Seconds()), fmt.Sprintf("%.1f", r.Events.Mean), strconv.FormatInt(r.Events.Max, 10),
		fmt.Sprintf("%.1f/%d", r.Lists.Mean, r.Lists.Median), fmt.Sprintf("%.1f/%d", r.Watches.Mean, r.Watches.Median), cpuString(r.EtcdCPU), mibString(r.DB.DBBytes))
	md := fmt.Sprintf("| %d | %s | %d/%d | %s | %s | %.1f / %d | %s s | %s MiB |", c.Agents, j.MinMax, st.N, len(results),
		secondsOrDash(j.MedianMS), secondsOrDash(j.BeyondMS), r.Events.Mean, r.Events.Max, cpuString(r.EtcdCPU), mibString(r.DB.DBBytes))
	return row, jsonLine(j), md
}

// secondsOrDash formats milliseconds for people: "1.7 s", or "66 ms"
// under a second; "-" for nil.
func secondsOrDash(msec *float64) string {
	switch {
	case msec == nil:
		return "-"
	case *msec < 1000:
		return fmt.Sprintf("%.0f ms", *msec)
	}
	return fmt.Sprintf("%.1f s", *msec/1000)
}

// medianRun is the run of median round time among those that formed a
// round, else the last run.
func medianRun(results []roundResult) roundResult {
	var ok []roundResult
	for _, r := range results {
		if r.Round > 0 {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return results[len(results)-1]
	}
	slices.SortFunc(ok, func(a, b roundResult) int { return int(a.Round - b.Round) })
	return ok[len(ok)/2]
}

// roundOnce starts c.Agents agents of a fresh job, lets all of them call
// Next at once and returns how long until every member had its Round.
// Agents left out of the round (MIN<MAX, joined after the freeze) are
// stopped once the members are done. The result holds the counts and the
// etcd's cost also when the run fails.
func roundOnce(ctx context.Context, f roundsFlags, c roundCase, rep int) (res roundResult, err error) {
	runID := fmt.Sprintf("bench-rounds-%d-%d-%d-%d", c.Agents, c.Limits.Max, rep, time.Now().UnixNano())
	res.Counts, res.EtcdCPU, res.EtcdCPUNext = &storeCounts{}, -1, -1
	meter, err := newEtcdMeter(ctx, f.endpoint, f.etcdPID)
	if err != nil {
		return res, err
	}
	defer meter.close()
	before := meter.sample(ctx)
	agents, setupErr := startAgents(ctx, f, c, runID, res.Counts)
	defer closeAgents(agents)
	// Counts and costs as the run ends, before the agents leave.
	defer func() {
		after := meter.sample(ctx)
		res.EtcdCPU = cpuSince(before, after)
		res.DB = after.Status
		res.DBGrowth = -1
		if after.Status.DBInUseBytes >= 0 && before.Status.DBInUseBytes >= 0 {
			res.DBGrowth = after.Status.DBInUseBytes - before.Status.DBInUseBytes
		}
		res.Events = perAgentOf(agents, func(v *viewCounts) int64 { return v.Events.Load() })
		res.Lists = perAgentOf(agents, func(v *viewCounts) int64 { return v.Lists.Load() })
		res.Watches = perAgentOf(agents, func(v *viewCounts) int64 { return v.Watches.Load() })
	}()
	res.Setup = time.Since(before.At)
	if setupErr != nil {
		return res, fmt.Errorf("start agents: %w (%s)", setupErr, res.Counts)
	}
	atNext := meter.sample(ctx)
	defer func() { res.EtcdCPUNext = cpuSince(atNext, meter.sample(ctx)) }()
	rounds, d, err := formRound(ctx, agents, f.maxWait)
	if err != nil {
		return res, fmt.Errorf("%w (setup took %s; %s); %s", err, res.Setup.Round(time.Millisecond), res.Counts, liveLeases(ctx, f.endpoint))
	}
	res.Round, res.Members = d, rounds[0].NumNodes
	return res, nil
}

// startAgents starts c.Agents agents of job runID, at most 64 at a time,
// within f.setupTimeout. It returns the agents it started (nil where one
// did not) and the first error.
func startAgents(ctx context.Context, f roundsFlags, c roundCase, runID string, counts *storeCounts) ([]*agent, error) {
	agents := make([]*agent, c.Agents)
	sctx, cancel := context.WithTimeoutCause(ctx, f.setupTimeout, fmt.Errorf("the %d agents did not all join within -setup-timeout=%s", c.Agents, f.setupTimeout))
	defer cancel()
	g, gctx := errgroup.WithContext(sctx)
	g.SetLimit(64)
	for i := range agents {
		g.Go(func() error {
			a, err := startAgent(gctx, agentSpec{Endpoint: f.endpoint, RunID: runID, ID: fmt.Sprintf("agent-%04d", i),
				Limits: c.Limits, LastCall: c.LastCall, TTL: f.ttl, Counts: counts})
			if err != nil {
				if cause := context.Cause(gctx); cause != nil && !errors.Is(cause, context.Canceled) {
					return cause
				}
				return err
			}
			agents[i] = a
			return nil
		})
	}
	err := g.Wait()
	if err != nil {
		started := 0
		for _, a := range agents {
			if a != nil {
				started++
			}
		}
		err = fmt.Errorf("%w (%d of %d agents joined)", err, started, c.Agents)
	}
	return agents, err
}

// closeAgents makes every started agent leave, 256 at a time.
func closeAgents(agents []*agent) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
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
}

// formRound lets every agent call Next at once and returns each agent's
// round (the zero round for one left out) and how long until every member
// of the round had its Round. It fails when an agent's Next fails, the
// agents disagree, or no round formed within maxWait; the agents still in
// Next are stopped then.
func formRound(ctx context.Context, agents []*agent, maxWait time.Duration) ([]round, time.Duration, error) {
	nextCtx, stopNext := context.WithTimeoutCause(ctx, maxWait, fmt.Errorf("no round within -max-wait=%s", maxWait))
	defer stopNext()
	type got struct {
		agent int
		round round
		at    time.Time
		err   error
	}
	results := make(chan got, len(agents))
	start := make(chan struct{})
	for i, a := range agents {
		go func() {
			<-start
			r, err := a.next(nextCtx)
			results <- got{i, r, time.Now(), err}
		}()
	}
	t0 := time.Now()
	close(start)

	// Every Next returns before the caller closes the agents.
	rounds := make([]round, len(agents))
	var last time.Time
	var first round
	var failed error
	ranks := map[int]bool{}
	stopped := false
	for range agents {
		r := <-results
		switch {
		case stopped:
			continue // left out of the round, or after a failure: stopped by us
		case r.err != nil:
			failed = fmt.Errorf("%w, %s after Next began (%d members had their round)", r.err, r.at.Sub(t0).Round(time.Millisecond), len(ranks))
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
		rounds[r.agent] = r.round
		ranks[r.round.NodeRank] = true
		last = later(last, r.at)
		if len(ranks) == first.NumNodes {
			stopped = true
			stopNext() // the agents still waiting were left out
		}
	}
	if failed != nil {
		return nil, 0, failed
	}
	if len(ranks) != first.NumNodes {
		return nil, 0, fmt.Errorf("%d of %d members got their round", len(ranks), first.NumNodes)
	}
	return rounds, last.Sub(t0), nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
