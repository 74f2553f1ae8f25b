package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// agentLossResult is one repetition of the node loss among N in-process
// agents, as far as it got.
type agentLossResult struct {
	VictimRank int
	Form       time.Duration // Next on every agent to round 0 formed
	Detect     time.Duration // kill to the victim's node key deleted (its lease expired)
	Ended      time.Duration // kill to the last survivor seeing round 0 end
	Restart    time.Duration // kill to the last survivor having round 1
	Events     perAgent      // watch events per survivor, kill to round 1 formed
	EtcdCPU    float64       // etcd CPU seconds, kill to round 1 formed; -1: unknown
}

// lossFlags are the knobs of the agentloss command.
type lossFlags struct {
	roundsFlags
	agents int
}

func agentLossCmd(ctx context.Context, args []string) error {
	fs := newFlags("agentloss")
	var f lossFlags
	fs.StringVar(&f.endpoint, "endpoint", "", "etcd client endpoint")
	fs.IntVar(&f.agents, "agents", 1024, "agents in the job")
	fs.IntVar(&f.runs, "runs", 1, "repetitions (fresh run id each); even runs kill node rank 0, odd ones the last rank")
	fs.DurationVar(&f.ttl, "ttl", 5*time.Second, "lease TTL of each agent's session")
	fs.DurationVar(&f.maxWait, "max-wait", 30*time.Second, "a stage (round 0 forming; after the kill, TTL + this for round 1) fails after this")
	fs.DurationVar(&f.setupTimeout, "setup-timeout", 3*time.Minute, "a run fails when its agents have not all joined within this")
	fs.IntVar(&f.etcdPID, "etcd-pid", 0, "pid of the etcd server process, for its CPU time (0: not reported)")
	fs.BoolVar(&f.json, "json", false, "also print the result as one JSON line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.endpoint == "" || f.runs < 1 || f.agents < 3 || f.etcdPID < 0 {
		return errors.New("-endpoint is required, -runs at least 1, -agents at least 3, -etcd-pid not negative")
	}
	goal := f.ttl + time.Second
	fmt.Printf("== part 2b: node loss among %d agents (goroutines as in part 1), MIN:MAX %d:%d, lease TTL %s\n", f.agents, f.agents-1, f.agents, f.ttl)
	fmt.Printf("   round 0 forms; one agent's etcd client is closed without releasing its lease (a dead node); its lease expires in etcd\n")
	fmt.Printf("   detect = kill to its node key deleted; ended = kill to the last survivor seeing round 0 end; restart = kill to the last survivor's round 1\n\n")
	const header = "   %3s %6s %9s %9s %9s %9s %9s %8s %8s\n"
	fmt.Printf(header, "run", "victim", "form ms", "detect ms", "ended ms", "restart", "evt/agt", "evt max", "etcd cpu")
	var ended, restarts, detects, afterExpiry []time.Duration
	var last agentLossResult
	failures := 0
	for i := 0; i < f.runs; i++ {
		r, err := agentLossOnce(ctx, f, i)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = r
		row := []any{strconv.Itoa(i), strconv.Itoa(r.VictimRank), msOrDash(r.Form), msOrDash(r.Detect), msOrDash(r.Ended), msOrDash(r.Restart),
			fmt.Sprintf("%.1f", r.Events.Mean), strconv.FormatInt(r.Events.Max, 10), cpuString(r.EtcdCPU)}
		fmt.Printf(header, row...)
		if err != nil {
			failures++
			fmt.Printf("          run %d: %v\n", i, err)
			continue
		}
		ended, restarts = append(ended, r.Ended), append(restarts, r.Restart)
		detects, afterExpiry = append(detects, r.Detect), append(afterExpiry, r.Ended-r.Detect)
	}
	e, rs := summarize(ended), summarize(restarts)
	line := fmt.Sprintf("goal: a node loss among %d agents ends the round for every other agent within TTL + 1 s = %s: ", f.agents, goal)
	if e.N == 0 {
		line += "MISSED (no run got that far)"
	} else {
		line += fmt.Sprintf("%s (kill to last round end: median %s ms, max %s ms; to round 1: median %s ms)",
			verdict(e.Max <= goal && failures == 0), ms(e.Median), ms(e.Max), ms(rs.Median))
	}
	fmt.Printf("\n   evt/agt, evt max: watch events delivered to each survivor from the kill to round 1 (last run); etcd cpu: CPU seconds of etcd in that time\n")
	fmt.Printf("\n%s\n\n", line)
	if f.json {
		fmt.Printf("%s\n\n", jsonLine(lossJSON{Part: "agentloss", Agents: f.agents, TTLMS: f.ttl.Milliseconds(), GoalMS: goal.Milliseconds(),
			OK: e.N, Runs: f.runs, DetectMS: msOrNil(summarize(detects)), EndedMS: msOrNil(e), EndedMaxMS: msOrNil(summary{N: e.N, Median: e.Max}),
			EndedAfterExpiryMS: msOrNil(summarize(afterExpiry)), RestartMS: msOrNil(rs),
			EventsPerAgent: last.Events.Mean, EventsPerAgentMax: last.Events.Max, EtcdCPUS: last.EtcdCPU}))
	}
	return nil
}

// lossJSON is the agentloss part as one JSON line; times are medians over
// the runs that got that far (null when none did).
type lossJSON struct {
	Part               string   `json:"part"`
	Agents             int      `json:"agents"`
	TTLMS              int64    `json:"ttl_ms"`
	GoalMS             int64    `json:"goal_ms"` // kill to every survivor's round end
	OK                 int      `json:"ok"`
	Runs               int      `json:"runs"`
	DetectMS           *float64 `json:"detect_ms"`             // kill to the victim's lease expired in etcd
	EndedMS            *float64 `json:"ended_ms"`              // kill to the last survivor's round end
	EndedMaxMS         *float64 `json:"ended_max_ms"`          // the worst run of that
	EndedAfterExpiryMS *float64 `json:"ended_after_expiry_ms"` // lease expiry to the last survivor's round end
	RestartMS          *float64 `json:"restart_ms"`            // kill to the last survivor's round 1
	EventsPerAgent     float64  `json:"events_per_agent"`      // kill to round 1, last run
	EventsPerAgentMax  int64    `json:"events_per_agent_max"`
	EtcdCPUS           float64  `json:"etcd_cpu_s"`
}

// msOrDash formats d in ms, "-" for zero (not measured).
func msOrDash(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return ms(d)
}

// msOrNil is the median of s in ms, nil when s is empty.
func msOrNil(s summary) *float64 {
	if s.N == 0 {
		return nil
	}
	v := msFloat(s.Median)
	return &v
}

// agentLossOnce forms round 0 of f.agents agents, kills one and times
// until every survivor saw the round end and had round 1.
func agentLossOnce(ctx context.Context, f lossFlags, rep int) (res agentLossResult, err error) {
	res.EtcdCPU = -1
	runID := fmt.Sprintf("bench-agentloss-%d-%d-%d", f.agents, rep, time.Now().UnixNano())
	c := roundCase{Agents: f.agents, Limits: limits{Min: f.agents - 1, Max: f.agents, Changes: 1}, LastCall: time.Second}
	meter, err := newEtcdMeter(ctx, f.endpoint, f.etcdPID)
	if err != nil {
		return res, err
	}
	defer meter.close()
	agents, err := startAgents(ctx, f.roundsFlags, c, runID, &storeCounts{})
	defer closeAgents(agents)
	if err != nil {
		return res, fmt.Errorf("start agents: %w", err)
	}
	rounds, form, err := formRound(ctx, agents, f.maxWait)
	res.Form = form
	if err != nil {
		return res, fmt.Errorf("round 0: %w", err)
	}

	victim := 0
	res.VictimRank = 0
	if rep%2 == 1 {
		res.VictimRank = len(agents) - 1
	}
	for i, r := range rounds {
		if r.NodeRank == res.VictimRank {
			victim = i
		}
	}
	var survivors []*agent
	var survivorRounds []round
	for i, a := range agents {
		if i != victim {
			survivors, survivorRounds = append(survivors, a), append(survivorRounds, rounds[i])
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deleted, err := watchNodeDeletes(wctx, meter.client, runID)
	if err != nil {
		return res, err
	}
	eventsBefore := make([]int64, len(survivors))
	for i, a := range survivors {
		eventsBefore[i] = a.view.Events.Load()
	}
	ends := make([]<-chan struct{}, len(survivors))
	for i, a := range survivors {
		ends[i] = a.roundEnded(wctx, survivorRounds[i])
	}
	before := meter.sample(ctx)
	killed := time.Now()
	agents[victim].die()

	stage := f.ttl + f.maxWait
	lastEnd, err := waitAll(ctx, ends, stage)
	if err != nil {
		return res, fmt.Errorf("after the kill: %w", err)
	}
	res.Ended = lastEnd.Sub(killed)
	_, _, err = formRound(ctx, survivors, stage)
	res.Restart = time.Since(killed)
	after := meter.sample(ctx)
	res.EtcdCPU = cpuSince(before, after)
	var sum int64
	for i, a := range survivors {
		n := a.view.Events.Load() - eventsBefore[i]
		sum += n
		res.Events.Max = max(res.Events.Max, n)
	}
	res.Events.Mean = math.Round(float64(sum)/float64(len(survivors))*10) / 10
	if err != nil {
		res.Restart = 0
		return res, fmt.Errorf("round 1: %w", err)
	}
	select {
	case at := <-deleted:
		res.Detect = at.Sub(killed)
	case <-time.After(5 * time.Second):
		return res, errors.New("the lost agent's node key was never deleted")
	}
	return res, nil
}

// waitAll waits until every channel in chans is closed and returns when
// the last one closed; it fails after within.
func waitAll(ctx context.Context, chans []<-chan struct{}, within time.Duration) (time.Time, error) {
	var mu sync.Mutex
	var last time.Time
	seen := 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ch
			mu.Lock()
			last = later(last, time.Now())
			seen++
			mu.Unlock()
		}()
	}
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-done:
		return last, nil
	case <-timer.C:
		mu.Lock()
		defer mu.Unlock()
		return time.Time{}, fmt.Errorf("%d of %d agents saw their round end within %s", seen, len(chans), within)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}
