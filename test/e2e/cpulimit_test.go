package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// cpuLimit holds process pid (every thread of it) to share of one CPU
// with a cgroup of its own (cgroup v2's cpu.max, or v1's CFS quota),
// until t's cleanup, which moves it back and removes the cgroup. Unlike
// stopping it by signals, the kernel then takes the time from the
// process's computing only: a rank that waits for its peers in a
// collective waits as long as before, as a slow GPU's or a busy host's
// rank would. Under cgroup v2 it turns the cpu controller on for the
// root's children first when it is off. It reports false where the
// machine has no cgroup cpu controller it can use (not root, say).
func cpuLimit(t *testing.T, pid int, share float64) bool {
	t.Helper()
	const period = 100 * time.Millisecond
	quota := time.Duration(share * float64(period))
	name := fmt.Sprintf("gorun-e2e-%d-%d", os.Getpid(), pid)
	type hierarchy struct {
		root, limit, value string
	}
	for _, h := range []hierarchy{
		{"/sys/fs/cgroup", "cpu.max", fmt.Sprintf("%d %d", quota.Microseconds(), period.Microseconds())}, // v2
		{"/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", strconv.FormatInt(quota.Microseconds(), 10)},          // v1
	} {
		if _, err := os.Stat(filepath.Join(h.root, "cgroup.procs")); err != nil {
			continue
		}
		if h.limit == "cpu.max" {
			_ = os.WriteFile(filepath.Join(h.root, "cgroup.subtree_control"), []byte("+cpu"), 0)
		}
		dir := filepath.Join(h.root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			continue
		}
		err := os.WriteFile(filepath.Join(dir, h.limit), []byte(h.value), 0)
		if err == nil && h.limit == "cpu.cfs_quota_us" {
			err = os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.FormatInt(period.Microseconds(), 10)), 0)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		}
		if err != nil {
			_ = os.Remove(dir)
			continue
		}
		t.Cleanup(func() {
			// Back to the root group (a process that has ended needs nothing),
			// then the empty group goes.
			_ = os.WriteFile(filepath.Join(h.root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("removing cgroup %s: %v", dir, err)
			}
		})
		t.Logf("pid %d held to %.0f%% of a CPU by cgroup %s", pid, share*100, dir)
		return true
	}
	return false
}
