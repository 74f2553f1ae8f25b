package proc_test

import (
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/proc"
)

// BenchmarkLaunch4 is what gorun adds to starting 4 no-op workers: a guard
// (this test binary, as gorun's is gorun), 4 /bin/true started with
// proc.Start with a linger, as the agent starts them, waited for, and the
// guard closed. Each iteration also times 4 /bin/true started and waited
// for with os/exec alone, and the benchmark reports the ratio of the
// medians (x-bare): a per-worker scan of /proc or a guard's start-up on
// the path shows there, whatever the machine's speed. It fails when a
// process cannot be started. bench/launch.sh compares the whole launch
// with torchrun.
func BenchmarkLaunch4(b *testing.B) {
	const workers = 4
	var ours, bare []time.Duration
	for b.Loop() {
		t0 := time.Now()
		guard, err := proc.StartGuard([]string{"/usr/bin/env", roleEnv + "=guard", self()})
		if err != nil {
			b.Fatal(err)
		}
		ps := make([]*proc.Process, workers)
		for i := range ps {
			if ps[i], err = proc.Start(proc.Spec{Path: "/bin/true", Guard: guard, Linger: 30 * time.Second}); err != nil {
				b.Fatal(err)
			}
		}
		for _, p := range ps {
			if r := p.Wait(); r.ExitCode != 0 || r.Err != nil {
				b.Fatalf("/bin/true: %s", r)
			}
		}
		if err := guard.Close(); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(t0))

		t0 = time.Now()
		cmds := make([]*exec.Cmd, workers)
		for i := range cmds {
			cmds[i] = exec.Command("/bin/true")
			if err := cmds[i].Start(); err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				b.Fatal(err)
			}
		}
		bare = append(bare, time.Since(t0))
	}
	o, r := median(ours), median(bare)
	b.ReportMetric(float64(o.Microseconds())/1000, "ms-launch")
	b.ReportMetric(float64(r.Microseconds())/1000, "ms-bare")
	b.ReportMetric(float64(o)/float64(r), "x-bare")
}

// median is the median of ds (which it sorts).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
