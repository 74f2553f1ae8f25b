package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// jobRow is one way to run the 2 nodes x 2 workers job.
type jobRow struct {
	Workload string // ddp, noop or wide
	Launcher string // bare, gorun etcd, gorun static, torchrun c10d
}

// jobEnv is what the job needs: the interpreter with torch, gloo on
// loopback, one thread per worker (both launchers default to it).
type jobEnv struct {
	endpoint, gorun, python, train, dir string
	steps                               int
	wide                                int           // nodes of the wide rows, one worker each
	wideTimeout                         time.Duration // bound of one wide run
}

// wideWorker marks that it started (the file's mtime), for the wide rows.
const wideWorker = `: > "$RDZVBENCH_OUT/started-$RANK"`

// jobTimes is how long one run of a row took.
type jobTimes struct {
	Started time.Duration // first launcher started to the last worker started (wide rows only)
	End     time.Duration // first launcher started to the last one's exit
}

const (
	launchBare     = "no launcher"
	launchEtcd     = "gorun etcd"
	launchStatic   = "gorun static"
	launchTorchrun = "torchrun c10d"
)

func jobCmd(ctx context.Context, args []string) error {
	fs := newFlags("job")
	var env jobEnv
	fs.StringVar(&env.endpoint, "endpoint", "", "etcd client endpoint (gorun etcd rows)")
	fs.StringVar(&env.gorun, "gorun", "", "the gorun binary")
	fs.StringVar(&env.python, "python", "/usr/bin/python3", "the python with torch (torchrun and the DDP workers)")
	fs.StringVar(&env.train, "train", "", "examples/ddp/train.py")
	fs.StringVar(&env.dir, "dir", "", "scratch dir")
	fs.IntVar(&env.steps, "steps", 5, "train.py --steps")
	runs := fs.Int("runs", 5, "timed runs of each noop row")
	ddpRuns := fs.Int("ddp-runs", 3, "timed runs of each ddp row")
	goal := fs.Float64("goal", 0.1, "goal: gorun <= goal x torchrun")
	workloads := fs.String("workloads", "noop,ddp", "rows to run: noop, ddp, wide")
	fs.IntVar(&env.wide, "wide-agents", 64, "wide rows: launcher processes (nodes), one no-op worker each")
	fs.DurationVar(&env.wideTimeout, "wide-timeout", 10*time.Minute, "wide rows: a run fails after this")
	asJSON := fs.Bool("json", false, "also print each row as one JSON line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if env.endpoint == "" || env.gorun == "" || env.train == "" || env.dir == "" || *runs < 1 || *ddpRuns < 1 || env.wide < 2 {
		return errors.New("-endpoint, -gorun, -train and -dir are required; -runs and -ddp-runs at least 1, -wide-agents at least 2")
	}
	var rows []jobRow
	for _, w := range strings.Split(*workloads, ",") {
		switch w = strings.TrimSpace(w); w {
		case "ddp":
			rows = append(rows, jobRow{w, launchBare})
			fallthrough
		case "noop":
			rows = append(rows, jobRow{w, launchEtcd}, jobRow{w, launchStatic}, jobRow{w, launchTorchrun})
		case "wide":
			rows = append(rows, jobRow{w, launchEtcd}, jobRow{w, launchTorchrun})
		default:
			return fmt.Errorf("-workloads: unknown %q (want noop, ddp, wide)", w)
		}
	}
	fmt.Printf("== part 3: a 2 nodes x 2 workers job, two launcher processes on this machine started together, until both exit\n")
	fmt.Printf("   noop: --no-python /bin/true workers; ddp: %s --steps %d (%s, GLOO_SOCKET_IFNAME=lo)\n", env.train, env.steps, env.python)
	fmt.Printf("   %s: 4 workers started directly with the torchrun environment, the floor for any launcher\n", launchBare)
	fmt.Printf("   wide: %d launcher processes (nodes) x 1 worker (sh -c ': > file'), gorun on the etcd beside torchrun c10d; measured to the last worker started and to the job's end\n", env.wide)
	fmt.Printf("   %d runs of each noop and wide row, %d of each ddp row, interleaved (the order rotates every run), after untimed warm-ups\n\n", *runs, *ddpRuns)

	// Warm-ups: Python's and torch's files into the page cache, gorun's
	// binary and the etcd's first client.
	for _, row := range rows {
		if row.Workload != "wide" && (row.Launcher == launchTorchrun || row.Launcher == launchEtcd || row.Launcher == launchBare) {
			if _, err := runJob(ctx, env, row, -1); err != nil {
				return fmt.Errorf("%s %s, warm-up: %w", row.Workload, row.Launcher, err)
			}
		}
	}
	samples := map[jobRow][]time.Duration{}
	started := map[jobRow][]time.Duration{}
	wideFailed := map[jobRow]error{}
	for i := 0; i < max(*runs, *ddpRuns); i++ {
		for k := range rows {
			row := rows[(k+i)%len(rows)]
			if (row.Workload == "ddp" && i >= *ddpRuns) || (row.Workload != "ddp" && i >= *runs) || wideFailed[row] != nil {
				continue
			}
			t, err := runJob(ctx, env, row, i)
			if err != nil && row.Workload == "wide" && ctx.Err() == nil {
				// Reported in the wide table; the other rows go on.
				wideFailed[row] = fmt.Errorf("run %d: %w", i, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s %s, run %d: %w", row.Workload, row.Launcher, i, err)
			}
			samples[row] = append(samples[row], t.End)
			started[row] = append(started[row], t.Started)
		}
	}

	var small []jobRow // the 2 nodes x 2 workers rows
	for _, row := range rows {
		if row.Workload != "wide" {
			small = append(small, row)
		}
	}
	var verdicts []string
	if len(small) > 0 {
		verdicts = printSmall(small, samples, *goal)
	}
	var jsonLines []string
	if hasWide(rows) {
		v, js := printWide(env, samples, started, wideFailed, *goal)
		verdicts, jsonLines = append(verdicts, v...), js
	}
	fmt.Printf("\ngoal: gorun <= %gx torchrun (median wall time; wide: to the last worker started):\n", *goal)
	for _, v := range verdicts {
		fmt.Printf("   %s\n", v)
	}
	fmt.Println()
	if *asJSON {
		for _, row := range small {
			s := summarize(samples[row])
			jsonLines = append(jsonLines, jsonLine(jobJSON{Part: "job", Workload: row.Workload, Launcher: row.Launcher,
				Nodes: 2, NProcPerNode: 2, Runs: s.N, EndMS: msOrNil(s)}))
		}
		for _, l := range jsonLines {
			fmt.Println(l)
		}
		fmt.Println()
	}
	return nil
}

// printSmall prints the table of the 2 nodes x 2 workers rows and
// returns their verdicts against goal (gorun <= goal x torchrun).
func printSmall(rows []jobRow, samples map[jobRow][]time.Duration, goal float64) []string {
	fmt.Printf("   %-8s %-14s %10s %10s %10s %12s %16s\n", "workload", "launcher", "median ms", "min ms", "max ms", "/torchrun", "overhead ms")
	var verdicts []string
	for _, row := range rows {
		s := summarize(samples[row])
		tr := summarize(samples[jobRow{row.Workload, launchTorchrun}])
		ratio := float64(s.Median) / float64(tr.Median)
		over := "-"
		if bare, ok := samples[jobRow{row.Workload, launchBare}]; ok && row.Launcher != launchBare {
			over = ms(s.Median - summarize(bare).Median)
		} else if row.Workload == "noop" {
			over = ms(s.Median) // the workers take no time
		}
		fmt.Printf("   %-8s %-14s %10s %10s %10s %11.3fx %16s\n", row.Workload, row.Launcher, ms(s.Median), ms(s.Min), ms(s.Max), ratio, over)
		if strings.HasPrefix(row.Launcher, "gorun") {
			verdicts = append(verdicts, fmt.Sprintf("%s %s %.3fx: %s", row.Workload, row.Launcher, ratio, verdict(ratio <= goal)))
		}
	}
	fmt.Printf("\n   overhead = median - the %s median of the same workload (noop: the whole time)\n", launchBare)
	if _, ok := samples[jobRow{"ddp", launchBare}]; ok {
		bare := summarize(samples[jobRow{"ddp", launchBare}]).Median
		tr := summarize(samples[jobRow{"ddp", launchTorchrun}]).Median - bare
		for _, l := range []string{launchEtcd, launchStatic} {
			g := summarize(samples[jobRow{"ddp", l}]).Median - bare
			fmt.Printf("   ddp launcher overhead %s / torchrun c10d: %.3fx\n", l, float64(g)/float64(tr))
		}
	}
	return verdicts
}

// jobJSON is one row of the job part as a JSON line: medians in ms.
type jobJSON struct {
	Part         string   `json:"part"`
	Workload     string   `json:"workload"`
	Launcher     string   `json:"launcher"`
	Nodes        int      `json:"nodes"`
	NProcPerNode int      `json:"nproc_per_node"`
	Runs         int      `json:"runs"`
	StartedMS    *float64 `json:"started_ms,omitempty"` // to the last worker started (wide rows)
	EndMS        *float64 `json:"end_ms"`               // to the last launcher's exit
}

// hasWide reports whether rows hold the wide workload.
func hasWide(rows []jobRow) bool {
	for _, r := range rows {
		if r.Workload == "wide" {
			return true
		}
	}
	return false
}

// printWide prints the wide rows' table and returns their verdicts and
// JSON lines. The goal is judged on the time to the last worker started.
func printWide(env jobEnv, ends, started map[jobRow][]time.Duration, failed map[jobRow]error, goal float64) ([]string, []string) {
	fmt.Printf("\n   wide: %d nodes x 1 no-op worker, one launcher process per node on this machine\n", env.wide)
	fmt.Printf("   %-14s %7s %14s %14s %12s %12s\n", "launcher", "runs", "started ms", "end ms", "started/tr", "end/tr")
	g, tr := jobRow{"wide", launchEtcd}, jobRow{"wide", launchTorchrun}
	trStart, trEnd := summarize(started[tr]), summarize(ends[tr])
	var jsonLines []string
	for _, row := range []jobRow{g, tr} {
		st, en := summarize(started[row]), summarize(ends[row])
		rs, re := "-", "-"
		if st.N > 0 && trStart.N > 0 {
			rs = fmt.Sprintf("%.3fx", float64(st.Median)/float64(trStart.Median))
			re = fmt.Sprintf("%.3fx", float64(en.Median)/float64(trEnd.Median))
		}
		fmt.Printf("   %-14s %7d %14s %14s %12s %12s\n", row.Launcher, st.N, msOrDash(st.Median), msOrDash(en.Median), rs, re)
		if err := failed[row]; err != nil {
			fmt.Printf("          %v\n", err)
		}
		jsonLines = append(jsonLines, jsonLine(jobJSON{Part: "job", Workload: "wide", Launcher: row.Launcher,
			Nodes: env.wide, NProcPerNode: 1, Runs: st.N, StartedMS: msOrNil(st), EndMS: msOrNil(en)}))
	}
	gs := summarize(started[g])
	if gs.N > 0 && trStart.N == 0 && errors.Is(failed[tr], errTimedOut) {
		// torchrun took longer than the bound: the ratio is at most this.
		ratio := float64(gs.Median) / float64(env.wideTimeout)
		return []string{fmt.Sprintf("wide (%d nodes) gorun etcd %s to the last worker started, torchrun c10d > %s (timed out): ratio < %.3fx: %s",
			env.wide, ms(gs.Median)+" ms", env.wideTimeout, ratio, verdict(ratio <= goal))}, jsonLines
	}
	if gs.N == 0 || trStart.N == 0 {
		return []string{"wide gorun etcd: MISSED (a row did not run)"}, jsonLines
	}
	ratio := float64(gs.Median) / float64(trStart.Median)
	return []string{fmt.Sprintf("wide (%d nodes) gorun etcd %.3fx to the last worker started: %s", env.wide, ratio, verdict(ratio <= goal))}, jsonLines
}

// runJob runs row once and returns the time from starting the first
// process to the last one's exit (and, for wide rows, to the last worker
// started); every process must exit 0.
func runJob(ctx context.Context, env jobEnv, row jobRow, rep int) (jobTimes, error) {
	tag := strings.ReplaceAll(fmt.Sprintf("%s-%s-%d-%d", row.Workload, row.Launcher, rep+1, time.Now().UnixNano()), " ", "-")
	dir := filepath.Join(env.dir, tag)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return jobTimes{}, err
	}
	defer sweep(partEnv, tag)
	common := []string{partEnv + "=" + tag, "PYTHON=" + env.python, "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "RDZVBENCH_OUT=" + dir}
	port, err := freePort("127.0.0.1")
	if err != nil {
		return jobTimes{}, err
	}
	var entry []string // the launchers' entrypoint and args
	gorunEntry := []string{"--no-python", "/bin/true"}
	torchEntry := []string{"--no_python", "/bin/true"}
	nodes, nproc := 2, 2
	switch row.Workload {
	case "ddp":
		entry = []string{env.train, "--steps", strconv.Itoa(env.steps)}
		gorunEntry, torchEntry = entry, entry
	case "wide":
		nodes, nproc = env.wide, 1
		gorunEntry = []string{"--no-python", "/bin/sh", "-c", wideWorker}
		torchEntry = []string{"--no_python", "/bin/sh", "-c", wideWorker}
	}
	n, np := strconv.Itoa(nodes), strconv.Itoa(nproc)

	type spec struct {
		name string
		env  []string
		argv []string
	}
	var specs []spec
	switch row.Launcher {
	case launchBare:
		if row.Workload != "ddp" {
			return jobTimes{}, errors.New("the bare row is for ddp only")
		}
		for rank := 0; rank < 4; rank++ {
			specs = append(specs, spec{fmt.Sprintf("rank%d", rank), []string{
				"RANK=" + strconv.Itoa(rank), "LOCAL_RANK=" + strconv.Itoa(rank%2), "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2",
				"GROUP_RANK=" + strconv.Itoa(rank/2), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port),
				"TORCHELASTIC_RESTART_COUNT=0", "ROLE_RANK=" + strconv.Itoa(rank), "ROLE_WORLD_SIZE=4",
			}, append([]string{env.python, "-u"}, entry...)})
		}
	case launchEtcd:
		for node := 0; node < nodes; node++ {
			specs = append(specs, spec{fmt.Sprintf("n%d", node), nil, append([]string{env.gorun,
				"--nnodes=" + n, "--nproc-per-node=" + np, "--rdzv-backend=etcd", "--rdzv-endpoint=" + env.endpoint,
				"--rdzv-id=" + tag, "--local-addr=127.0.0.1", fmt.Sprintf("--node-name=n%d", node)}, gorunEntry...)})
		}
	case launchStatic:
		for node := 0; node < 2; node++ {
			specs = append(specs, spec{fmt.Sprintf("n%d", node), nil, append([]string{env.gorun,
				"--nnodes=2", "--nproc-per-node=2", fmt.Sprintf("--node-rank=%d", node), "--master-addr=127.0.0.1",
				fmt.Sprintf("--master-port=%d", port), fmt.Sprintf("--node-name=n%d", node)}, gorunEntry...)})
		}
	case launchTorchrun:
		for node := 0; node < nodes; node++ {
			specs = append(specs, spec{fmt.Sprintf("n%d", node), nil, append([]string{env.python,
				"-m", "torch.distributed.run", "--nnodes=" + n, "--nproc_per_node=" + np, "--rdzv_backend=c10d",
				fmt.Sprintf("--rdzv_endpoint=127.0.0.1:%d", port), "--rdzv_id=" + tag, "--monitor_interval=0.1",
				"--redirects", "9:1", "--tee", "9:1"}, torchEntry...)})
		}
	default:
		return jobTimes{}, fmt.Errorf("unknown launcher %q", row.Launcher)
	}

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop(5 * time.Second)
		}
	}()
	t0 := time.Now()
	for _, s := range specs {
		p, err := startProc(s.name, append(common, s.env...), filepath.Join(dir, s.name+".log"), s.argv...)
		if err != nil {
			return jobTimes{}, err
		}
		procs = append(procs, p)
	}
	within := 3 * time.Minute
	if row.Workload == "wide" {
		within = env.wideTimeout
	}
	deadline := t0.Add(within)
	var end time.Time
	for _, p := range procs {
		if err := p.wait(ctx, time.Until(deadline)); err != nil {
			return jobTimes{}, err
		}
		if code := p.exitCode(); code != 0 {
			return jobTimes{}, fmt.Errorf("%s: exit %d; its log ends:\n%s", p.name, code, p.tail())
		}
		end = later(end, p.end)
	}
	t := jobTimes{End: end.Sub(t0)}
	if row.Workload == "wide" {
		last, err := lastStarted(dir, nodes*nproc)
		if err != nil {
			return jobTimes{}, err
		}
		t.Started = last.Sub(t0)
	}
	_ = os.RemoveAll(dir)
	return t, nil
}

// lastStarted returns the latest mtime of the want workers' started-RANK
// files in dir: when the last worker started.
func lastStarted(dir string, want int) (time.Time, error) {
	files, err := filepath.Glob(filepath.Join(dir, "started-*"))
	if err != nil {
		return time.Time{}, err
	}
	if len(files) != want {
		return time.Time{}, fmt.Errorf("%d workers started, want %d", len(files), want)
	}
	var last time.Time
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return time.Time{}, err
		}
		last = later(last, st.ModTime())
	}
	return last, nil
}
