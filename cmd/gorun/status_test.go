package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
)

func TestWriteStatusNamesTheIncarnation(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := rendezvous.State{Round: 1, Phase: rendezvous.PhaseClosed, Result: rendezvous.ResultSucceeded, Since: now.Add(-time.Hour)}
	for _, tc := range []struct {
		name string
		st   rendezvous.Status
		want string
	}{
		{"never started", rendezvous.Status{RunID: "x"}, "run x: no rendezvous on this etcd (no agent of this run id has started, or its keys expired)\n"},
		{"starting", rendezvous.Status{RunID: "x", Started: true, Incarnation: 2}, "run x incarnation 2: starting, no round yet\n"},
		{"finished, requeued", rendezvous.Status{RunID: "7", Started: true, Incarnation: 1, Generation: 1, Exists: true, State: closed},
			"run 7 incarnation 1 (SLURM restart 1): round 1 closed since 02:04:05 (1h0m0s ago)\nresult: succeeded\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			writeStatus(&buf, tc.st, now)
			require.Contains(t, buf.String(), tc.want)
		})
	}
}
