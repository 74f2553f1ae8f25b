package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// roundWorker records the round and rank it was given, one file per
// (round, rank), then sleeps until it is stopped.
const roundWorker = `echo "$RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $MASTER_ADDR:$MASTER_PORT $GROUP_RANK" > "$OUT/round$TORCHELASTIC_RESTART_COUNT-rank$RANK"; exec sleep 300`

// lossResult is one repetition of the node-loss measurement.
type lossResult struct {
	Form    time.Duration // three agents started to all 6 workers of round 0 started
	Detect  time.Duration // kill -9 to the killed agent's node key deleted (its lease expired)
	Restart time.Duration // kill -9 to all 4 workers of round 1 started
}

func nodeLossCmd(ctx context.Context, args []string) error {
	fs := newFlags("nodeloss")
	endpoint := fs.String("endpoint", "", "etcd client endpoint")
	gorun := fs.String("gorun", "", "the gorun binary")
	dir := fs.String("dir", "", "scratch dir")
	runs := fs.Int("runs", 5, "repetitions")
	ttl := fs.Int("ttl", 5, "lease_ttl in seconds")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *endpoint == "" || *gorun == "" || *dir == "" || *runs < 1 || *ttl < 1 {
		return errors.New("-endpoint, -gorun and -dir are required; -runs and -ttl at least 1")
	}
	client, err := dialEtcd(ctx, *endpoint)
	if err != nil {
		return err
	}
	defer client.Close()

	ttlD := time.Duration(*ttl) * time.Second
	fmt.Printf("== part 2: node loss to restart: 3 gorun agents --nnodes=2:3 --nproc-per-node=2, lease_ttl=%d, last_call_timeout=1\n", *ttl)
	fmt.Printf("   kill -9 of one agent (node-a, -b, -c in turn) to all 4 workers of the next round started (the workers' files' mtime); %d runs\n", *runs)
	fmt.Printf("   detect = kill to the lost agent's lease expiring in etcd (its node key deleted); restart = kill to the 4th worker of the new round\n\n")
	var forms, detects, restarts []time.Duration
	for i := 0; i < *runs; i++ {
		r, err := nodeLossOnce(ctx, client, *endpoint, *gorun, filepath.Join(*dir, fmt.Sprintf("nodeloss-%d", i)), *ttl, i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		fmt.Printf("   run %d: round 0 formed in %s ms; detect %s ms; restart %s ms\n", i, ms(r.Form), ms(r.Detect), ms(r.Restart))
		forms, detects, restarts = append(forms, r.Form), append(detects, r.Detect), append(restarts, r.Restart)
	}
	fmt.Println()
	fmt.Printf("   %-34s %10s %10s %10s\n", "", "median ms", "min ms", "max ms")
	for _, row := range []struct {
		name string
		s    summary
	}{
		{"3 agents start to round 0 running", summarize(forms)},
		{"kill -9 to lease expired (detect)", summarize(detects)},
		{"kill -9 to next round's workers", summarize(restarts)},
	} {
		fmt.Printf("   %-34s %10s %10s %10s\n", row.name, ms(row.s.Median), ms(row.s.Min), ms(row.s.Max))
	}
	s := summarize(restarts)
	fmt.Printf("\ngoal: node loss to restart <= TTL + 1 s = %s: %s (median %s ms, max %s ms)\n\n",
		ttlD+time.Second, verdict(s.Median <= ttlD+time.Second), ms(s.Median), ms(s.Max))
	return nil
}

// nodeLossOnce runs three agents of a fresh job, kills one with SIGKILL
// once round 0 runs, and times the next round.
func nodeLossOnce(ctx context.Context, client *clientv3.Client, endpoint, gorun, dir string, ttl, rep int) (res lossResult, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	runID := fmt.Sprintf("bench-nodeloss-%d-%d", rep, time.Now().UnixNano())
	part := runID
	defer sweep(partEnv, part)
	names := []string{"node-a", "node-b", "node-c"}
	var agents []*proc
	defer func() {
		for _, a := range agents {
			a.stop(10 * time.Second)
		}
	}()
	started := time.Now()
	for _, name := range names {
		p, err := startProc(name, []string{"OUT=" + dir, partEnv + "=" + part}, filepath.Join(dir, name+".log"),
			gorun, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=etcd", "--rdzv-endpoint="+endpoint,
			"--rdzv-id="+runID, "--node-name="+name, "--local-addr=127.0.0.1", "--term-timeout=5s",
			"--rdzv-conf=lease_ttl="+strconv.Itoa(ttl)+",last_call_timeout=1,join_timeout=60",
			"--log-format=json", "--", "/bin/sh", "-c", roundWorker)
		if err != nil {
			return res, err
		}
		agents = append(agents, p)
	}
	if _, err := waitWorkers(ctx, dir, 0, 6, 90*time.Second, agents); err != nil {
		return res, err
	}
	res.Form = time.Since(started)

	// Watch the job's node keys for the lost agent's lease to expire.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deleted, err := watchNodeDeletes(wctx, client, runID)
	if err != nil {
		return res, err
	}

	victim := agents[rep%len(agents)]
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		return res, err
	}
	alive := make([]*proc, 0, 2)
	for _, a := range agents {
		if a != victim {
			alive = append(alive, a)
		}
	}
	last, err := waitWorkers(ctx, dir, 1, 4, time.Duration(ttl)*time.Second+60*time.Second, alive)
	if err != nil {
		return res, err
	}
	res.Restart = last.Sub(killed)
	select {
	case at := <-deleted:
		res.Detect = at.Sub(killed)
	case <-time.After(5 * time.Second):
		return res, errors.New("the lost agent's node key was never deleted")
	}
	return res, nil
}

// waitWorkers waits until world workers of round n wrote their files in
// dir and returns the latest file's modification time (when it was
// written). It fails after within, or when one of agents exits first.
func waitWorkers(ctx context.Context, dir string, n, world int, within time.Duration, agents []*proc) (time.Time, error) {
	deadline := time.Now().Add(within)
	pattern := filepath.Join(dir, fmt.Sprintf("round%d-rank*", n))
	for {
		files, _ := filepath.Glob(pattern)
		if len(files) >= world {
			var last time.Time
			for _, f := range files {
				if st, err := os.Stat(f); err == nil && st.ModTime().After(last) {
					last = st.ModTime()
				}
			}
			return last, nil
		}
		for _, a := range agents {
			select {
			case <-a.done:
				return time.Time{}, fmt.Errorf("%s exited (%v) before round %d had %d workers; its log ends:\n%s", a.name, a.err, n, world, a.tail())
			default:
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("round %d: %d of %d workers started within %s", n, len(files), world, within)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
