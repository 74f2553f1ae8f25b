package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

func TestWriteStatusNamesTheIncarnation(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := rendezvous.State{Round: 1, Phase: rendezvous.PhaseClosed, Result: rendezvous.ResultSucceeded, Since: now.Add(-time.Hour)}
	for _, tc := range []struct {
		name string
		st   etcdstore.Status
		want string
	}{
		{"never started", etcdstore.Status{RunID: "x"}, "run x: no rendezvous on this etcd (no agent of this run id has started, or its keys expired)\n"},
		{"starting", etcdstore.Status{RunID: "x", Started: true, Incarnation: 2}, "run x incarnation 2: starting, no round yet\n"},
		{"finished, requeued", etcdstore.Status{RunID: "7", Started: true, Incarnation: 1, Generation: 1, Exists: true, State: closed},
			"run 7 incarnation 1 (SLURM restart 1): round 1 closed since 02:04:05 (1h0m0s ago)\nresult: succeeded\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			writeStatus(&buf, tc.st, now)
			require.Contains(t, buf.String(), tc.want)
		})
	}
}

// gorun status always lists the job's first failure, however many follow.
func TestWriteFailuresKeepsTheFirst(t *testing.T) {
	mk := func(n int) []rendezvous.Failure {
		var fs []rendezvous.Failure
		for i := range n {
			fs = append(fs, rendezvous.Failure{Host: "node", Rank: i, ExitCode: 1, Error: "boom"})
		}
		return fs
	}
	tests := []struct {
		n          int
		want, skip []string
	}{
		{3, []string{"failures (3, first first):", "rank 0 on node", "rank 2 on node"}, []string{"more"}},
		{8, []string{"failures (8, first first; the first and the last 4):", "rank 0 on node", "... 3 more", "rank 4 on node", "rank 7 on node"},
			[]string{"rank 1 on node", "rank 3 on node"}},
	}
	for _, tc := range tests {
		var b strings.Builder
		writeFailures(&b, mk(tc.n))
		for _, w := range tc.want {
			require.Contains(t, b.String(), w)
		}
		for _, s := range tc.skip {
			require.NotContains(t, b.String(), s)
		}
		require.True(t, strings.HasPrefix(strings.SplitN(b.String(), "\n", 3)[1], "  round 0: rank 0 on node"), b.String())
	}
}
