package e2e

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
)

// Fast tests: worker programs are /bin/sh, no PyTorch needed.

// TestRanksAndWorldSize: every worker sees its RANK and WORLD_SIZE, and its
// output comes back prefixed [host:rank], for each way of naming a program.
func TestRanksAndWorldSize(t *testing.T) {
	const script = `echo "$RANK $WORLD_SIZE"`
	cases := []struct {
		name string
		args []string
	}{
		{"double-dash", []string{"--standalone", "--nproc-per-node=3", "--", "/bin/sh", "-c", script}},
		{"no-python", []string{"--standalone", "--nproc-per-node=3", "--no-python", "/bin/sh", "-c", script}},
		{"torchrun-spelling", []string{"--standalone", "--nproc_per_node=3", "--no_python", "/bin/sh", "-c", script}},
		{"separate-value", []string{"--standalone", "--nproc-per-node", "3", "--", "/bin/sh", "-c", script}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGorun(t, nil, tc.args...)
			if r.ExitCode != 0 {
				t.Fatalf("exit %d, want 0", r.ExitCode)
			}
			lines := workerLines(r.Stdout)
			got := map[int]string{}
			hosts := map[string]bool{}
			for _, l := range lines {
				if _, dup := got[l.Rank]; dup {
					t.Errorf("rank %d printed more than one line: %q", l.Rank, l.Text)
				}
				got[l.Rank] = l.Text
				hosts[l.Host] = true
			}
			for rank := 0; rank < 3; rank++ {
				want := fmt.Sprintf("%d 3", rank)
				if got[rank] != want {
					t.Errorf("[host:%d] line = %q, want %q (RANK WORLD_SIZE)", rank, got[rank], want)
				}
			}
			if len(got) != 3 {
				t.Errorf("got worker lines for ranks %v, want exactly 0..2", keys(got))
			}
			if len(hosts) != 1 {
				t.Errorf("workers of one node report different hosts in their prefix: %v", hosts)
			}
		})
	}
}

// contractVars is the torchrun environment contract (docs/design.md) every worker must get.
var contractVars = []string{
	"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
	"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
	"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
	"TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}

// envScript prints "KEY=VALUE" (or "KEY unset") for every contract variable on one line.
func envScript() string {
	var b strings.Builder
	b.WriteString(`out=""; `)
	for _, v := range contractVars {
		fmt.Fprintf(&b, `if [ -n "${%[1]s+x}" ]; then out="$out %[1]s=${%[1]s}"; else out="$out %[1]s:unset"; fi; `, v)
	}
	b.WriteString(`echo "ENV$out"`)
	return b.String()
}

// parseEnvLines collects, per global rank, the variables printed by envScript.
func parseEnvLines(t *testing.T, stdout string) map[int]map[string]string {
	t.Helper()
	out := map[int]map[string]string{}
	for _, l := range workerLines(stdout) {
		if !strings.HasPrefix(l.Text, "ENV ") {
			continue
		}
		m := map[string]string{}
		for _, f := range strings.Fields(strings.TrimPrefix(l.Text, "ENV ")) {
			if k, v, ok := strings.Cut(f, "="); ok {
				m[k] = v
			} else {
				t.Errorf("[%s:%d] %s", l.Host, l.Rank, f)
			}
		}
		if m["RANK"] != strconv.Itoa(l.Rank) {
			t.Errorf("[%s:%d] prefix rank differs from RANK=%s", l.Host, l.Rank, m["RANK"])
		}
		out[l.Rank] = m
	}
	return out
}

// TestEnvContract: one node, 2 workers: every contract variable is set and consistent.
func TestEnvContract(t *testing.T) {
	r := runGorun(t, []string{"OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}, "--standalone", "--nproc-per-node=2", "--", "/bin/sh", "-c", envScript())
	if r.ExitCode != 0 {
		t.Fatalf("exit %d, want 0", r.ExitCode)
	}
	envs := parseEnvLines(t, r.Stdout)
	if len(envs) != 2 {
		t.Fatalf("got env lines for ranks %v, want 0 and 1", keys(envs))
	}
	for rank, m := range envs {
		want := map[string]string{
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(rank),
			"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
			"ROLE_RANK": strconv.Itoa(rank), "ROLE_WORLD_SIZE": "2",
			"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
			// unset in gorun's environment, so the launcher's default applies
			"OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", rank, k, m[k], v)
			}
		}
		for _, k := range []string{"ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS"} {
			if m[k] == "" {
				t.Errorf("rank %d: %s is empty or unset", rank, k)
			}
		}
		if p, err := strconv.Atoi(m["MASTER_PORT"]); err != nil || p <= 0 || p > 65535 {
			t.Errorf("rank %d: MASTER_PORT=%q is not a port", rank, m["MASTER_PORT"])
		}
	}
	if envs[0]["MASTER_ADDR"] != envs[1]["MASTER_ADDR"] || envs[0]["MASTER_PORT"] != envs[1]["MASTER_PORT"] ||
		envs[0]["TORCHELASTIC_RUN_ID"] != envs[1]["TORCHELASTIC_RUN_ID"] {
		t.Errorf("workers disagree on MASTER_ADDR/MASTER_PORT/TORCHELASTIC_RUN_ID: %v vs %v", envs[0], envs[1])
	}
}

// TestEnvTwoNodes: two static gorun agents on this machine form one world of 4.
func TestEnvTwoNodes(t *testing.T) {
	port := testutil.FreePort(t)
	results := waitAll(startAgents(t, nodeNames(2), nil, func(node int) []string {
		return []string{"--nnodes=2", fmt.Sprintf("--node-rank=%d", node), "--master-addr=127.0.0.1",
			fmt.Sprintf("--master-port=%d", port), "--nproc-per-node=2", "--", "/bin/sh", "-c", envScript()}
	}))
	all := map[int]map[string]string{}
	for node, r := range results {
		if r.ExitCode != 0 {
			t.Errorf("node %d: exit %d, want 0", node, r.ExitCode)
			continue
		}
		envs := parseEnvLines(t, r.Stdout)
		for rank, m := range envs {
			if rank/2 != node {
				t.Errorf("node %d ran global rank %d, want ranks %d and %d", node, rank, 2*node, 2*node+1)
			}
			want := map[string]string{
				"LOCAL_RANK": strconv.Itoa(rank % 2), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
				"GROUP_RANK": strconv.Itoa(node), "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0",
			}
			for k, v := range want {
				if m[k] != v {
					t.Errorf("node %d rank %d: %s=%q, want %q", node, rank, k, m[k], v)
				}
			}
			all[rank] = m
		}
	}
	if len(all) != 4 {
		t.Fatalf("got env lines for ranks %v, want 0..3", keys(all))
	}
	for rank := 1; rank < 4; rank++ {
		if all[rank]["MASTER_ADDR"] != all[0]["MASTER_ADDR"] || all[rank]["MASTER_PORT"] != all[0]["MASTER_PORT"] {
			t.Errorf("rank %d has MASTER=%s:%s, rank 0 has %s:%s", rank, all[rank]["MASTER_ADDR"],
				all[rank]["MASTER_PORT"], all[0]["MASTER_ADDR"], all[0]["MASTER_PORT"])
		}
	}
}

// TestWorkerFailureExitCode: gorun exits with the first failing worker's code,
// and stops the workers that are still running.
func TestWorkerFailureExitCode(t *testing.T) {
	cases := []struct {
		name   string
		nproc  int
		script string
		want   int
	}{
		{"all-exit-7", 2, `exit 7`, 7},
		{"rank1-exits-7", 3, `[ "$RANK" = 1 ] && exit 7; exit 0`, 7},
		// The peers would run for 5 minutes: gorun must stop them (and the
		// sleep they started) once rank 1 has failed.
		{"rank1-fails-peers-hang", 3, `if [ "$RANK" = 1 ]; then exit 7; fi; sleep 300`, 7},
		// docs/design.md: a signal death is exit code 128+N.
		{"killed-by-signal", 1, `kill -9 $$`, 128 + 9},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGorun(t, nil, "--standalone", fmt.Sprintf("--nproc-per-node=%d", tc.nproc), "--", "/bin/sh", "-c", tc.script)
			if r.ExitCode != tc.want {
				t.Errorf("exit %d, want %d", r.ExitCode, tc.want)
			}
			checkNoPanic(t, r)
		})
	}
}

// TestSIGTERMStopsWorkers: SIGTERM to gorun stops every worker (and their
// children) and gorun exits non-zero.
func TestSIGTERMStopsWorkers(t *testing.T) {
	p := startGorun(t, "gorun", nil, "--standalone", "--nproc-per-node=2", "--", "/bin/sh", "-c", `echo ready; sleep 300; echo not-stopped`)
	ready := p.waitOutput(60*time.Second, func(s string) bool {
		n := 0
		for _, l := range workerLines(s) {
			if l.Text == "ready" {
				n++
			}
		}
		return n == 2
	})
	if !ready {
		p.cancel()
		p.wait()
		t.Fatal("workers did not print ready")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to gorun: %v", err)
	}
	r := p.wait()
	if r.ExitCode == 0 {
		t.Errorf("exit 0 after SIGTERM, want non-zero")
	}
	if strings.Contains(r.Stdout, "not-stopped") {
		t.Errorf("a worker ran to completion after SIGTERM")
	}
	checkNoPanic(t, r)
}

// TestBadInput: invalid invocations exit 2 with exactly one line on stderr.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
	}{
		{"nnodes-min-above-max", []string{"--nnodes=3:2", "--nproc-per-node=1", "--", "/bin/true"}},
		{"unknown-flag", []string{"--bogus", "--standalone", "--nproc-per-node=1", "--", "/bin/true"}},
		{"missing-script", []string{"--standalone", "--nproc-per-node=1", "nope.py"}},
		{"nproc-not-a-number", []string{"--standalone", "--nproc-per-node=abc", "--", "/bin/true"}},
		{"nproc-zero", []string{"--standalone", "--nproc-per-node=0", "--", "/bin/true"}},
		{"no-program", []string{"--standalone", "--nproc-per-node=1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGorun(t, nil, tc.args...)
			if r.ExitCode != 2 {
				t.Errorf("exit %d, want 2", r.ExitCode)
			}
			checkNoPanic(t, r)
			lines := nonEmptyLines(r.Stderr)
			if len(lines) != 1 {
				t.Errorf("stderr has %d non-empty lines, want exactly 1:\n%s", len(lines), r.Stderr)
			}
			if len(workerLines(r.Stdout)) > 0 {
				t.Errorf("workers ran for invalid input:\n%s", r.Stdout)
			}
		})
	}
}

// checkNoPanic fails when gorun printed a Go panic or a goroutine dump.
func checkNoPanic(t *testing.T, r result) {
	t.Helper()
	for _, s := range []string{r.Stdout, r.Stderr} {
		for _, l := range strings.Split(s, "\n") {
			if workerLines(l) != nil {
				continue // a worker's own output
			}
			if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "goroutine ") || strings.HasPrefix(l, "fatal error:") {
				t.Errorf("gorun crashed with a Go panic:\n%s", s)
				return
			}
		}
	}
}

func keys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
