package worker

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/resume"
)

// envOf is a lookup over kv ("NAME=value" each).
func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// contract is a full torchrun contract of rank 0 in a world of size, plus extra.
func contract(size int, extra ...string) []string {
	return append([]string{"RANK=0", "LOCAL_RANK=0", fmt.Sprintf("WORLD_SIZE=%d", size), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", size),
		"GROUP_RANK=0", "GROUP_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}, extra...)
}

func TestWorkerEnv(t *testing.T) {
	alone := distenv.Worker{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1}
	cases := []struct {
		name string
		env  []string
		want distenv.Worker
		err  string
	}{
		{"nothing", nil, distenv.Worker{}, "not started by gorun or torchrun (RANK is not set)"},
		{"alone", []string{"WORLD_SIZE=1"}, alone, ""},
		{"alone, spaces", []string{"WORLD_SIZE= 1 "}, alone, ""},
		{"alone ignores the rest", []string{"WORLD_SIZE=1", "LOCAL_WORLD_SIZE=8", "TORCHELASTIC_ERROR_FILE=/x"}, alone, ""},
		{"world of two without RANK", []string{"WORLD_SIZE=2"}, distenv.Worker{}, "not started by gorun or torchrun"},
		{"RANK without the rest", []string{"RANK=0"}, distenv.Worker{}, "distenv: LOCAL_RANK is not set"},
		{"bad integer", contract(2, "RANK=x"), distenv.Worker{}, `distenv: RANK="x" is not an integer`},
		{"full contract", contract(2, "TORCHELASTIC_RESTART_COUNT=3", "TORCHELASTIC_ERROR_FILE=/tmp/e.json", "TORCHELASTIC_RUN_ID=job"),
			distenv.Worker{WorldSize: 2, LocalWorldSize: 2, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
				RestartCount: 3, ErrorFile: "/tmp/e.json", RunID: "job"}, ""},
		{"a world of one by contract keeps its error file", contract(1, "TORCHELASTIC_ERROR_FILE=/tmp/e.json"),
			distenv.Worker{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, ErrorFile: "/tmp/e.json"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := workerEnv(envOf(tc.env...))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, w)
		})
	}
}

func TestProgressOf(t *testing.T) {
	cases := []struct {
		name   string
		rec    metrics.Record
		round  int
		redone float64
		want   heartbeat.Progress
	}{
		{"figures pass through", metrics.Record{Step: 7, Loss: 2.5, TokensPerS: 1000, MFU: 0.25, Compute: 1500 * time.Millisecond}, 2, 3,
			heartbeat.Progress{Step: 7, Loss: 2.5, TokensPerS: 1000, MFU: 0.25, ComputeS: 1.5, Round: 2, Redone: 3}},
		{"no MFU is not reported", metrics.Record{Step: 1, Loss: 4}, 0, math.NaN(),
			heartbeat.Progress{Step: 1, Loss: 4, MFU: math.NaN(), Round: 0, Redone: math.NaN()}},
		{"no steps redone is reported as 0", metrics.Record{Step: 9, MFU: 0.5}, 1, 0,
			heartbeat.Progress{Step: 9, MFU: 0.5, Round: 1, Redone: 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The line is what goes to the agent; NaN != NaN rules out comparing structs.
			require.Equal(t, tc.want.Line(), progressOf(tc.rec, tc.round, tc.redone).Line())
		})
	}
}

func TestExitOf(t *testing.T) {
	requeue := &resume.StoppedError{Step: 12, Kind: resume.StopRequeue, Checkpoint: "/c/step-12"}
	term := &resume.StoppedError{Step: 12, Kind: resume.StopRequeue | resume.StopTerminate, Checkpoint: "/c/step-12"}
	peer := &comm.PeerError{Rank: 3, Op: "allreduce", Err: errors.New("EOF")}
	cases := []struct {
		name       string
		err        error
		terminated bool
		code       int
		msg        string
		lastWords  bool
	}{
		{"requeue", requeue, false, ExitRequeue, "worker rank 5: checkpointed step 12 to /c/step-12 and stopped (requeue requested); exit 75 asks to be requeued", true},
		{"requeue wrapped", fmt.Errorf("run: %w", requeue), false, ExitRequeue, "exit 75 asks to be requeued", true},
		{"SIGTERM saved", term, true, 143, "worker rank 5: stopped by terminated: checkpointed step 12", true},
		{"SIGINT", signalError{syscall.SIGINT}, false, 130, "worker rank 5: stopped by interrupt", false},
		{"SIGHUP", signalError{syscall.SIGHUP}, false, 129, "worker rank 5: stopped by hangup", false},
		{"SIGTERM at once", signalError{syscall.SIGTERM}, true, 143, "worker rank 5: stopped by terminated", false},
		{"SIGTERM, then a peer gone", peer, true, 143, "worker rank 5: stopped by terminated: comm: allreduce: peer rank 3: EOF", true},
		{"peer gone", peer, false, ExitFailed, "worker rank 5: comm: allreduce: peer rank 3: EOF", true},
		{"other failure", errors.New("boom"), false, ExitFailed, "worker rank 5: boom", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			xe, lastWords := exitOf(5, tc.err, tc.terminated)
			require.NotNil(t, xe)
			require.Equal(t, tc.code, xe.Code)
			require.Contains(t, xe.Error(), tc.msg)
			require.Equal(t, tc.lastWords, lastWords)
			require.ErrorIs(t, xe, tc.err, "the cause stays reachable")
		})
	}
	xe, lastWords := exitOf(0, nil, true)
	require.Nil(t, xe)
	require.False(t, lastWords)
}

func TestWriteErrorFile(t *testing.T) {
	dir := t.TempDir()
	read := func(path string) map[string]any {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		var doc map[string]any
		require.NoError(t, json.Unmarshal(b, &doc))
		return doc
	}
	plain := filepath.Join(dir, "plain.json")
	writeErrorFile(plain, errors.New("boom"))
	require.Equal(t, map[string]any{"message": "boom"}, read(plain))

	victim := filepath.Join(dir, "victim.json")
	writeErrorFile(victim, fmt.Errorf("step 4: %w", &comm.PeerError{Rank: 2, Op: "connect", Err: errors.New("refused")}))
	require.Equal(t, map[string]any{"message": "step 4: comm: connect: peer rank 2: refused", "lost_peer": 2.0}, read(victim))

	writeErrorFile("", errors.New("nowhere")) // no error file: nothing to do
	writeErrorFile(filepath.Join(dir, "missing", "e.json"), errors.New("best effort"))
	_, err := os.Stat(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestDumpParams(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dump")
	params := []float32{0, 1.5, -2, float32(math.Inf(1))}
	require.NoError(t, dumpParams(dir, 3, params))
	b, err := os.ReadFile(filepath.Join(dir, "rank-3.bin"))
	require.NoError(t, err)
	require.Len(t, b, 4*len(params))
	for i, p := range params {
		require.Equal(t, p, math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	require.ErrorContains(t, dumpParams(file, 0, params), "dump params: ")
}

func TestLogPhase(t *testing.T) {
	var out strings.Builder
	log := logPhase(&out, "worker rank 3")
	log(heartbeat.Idle, heartbeat.Training, "enter")
	log(heartbeat.Training, heartbeat.Idle, "leave")
	log(heartbeat.Training, heartbeat.Idle, "new round")
	require.Equal(t, fmt.Sprintf("worker rank 3: %s -> %s: new round\n", heartbeat.Training, heartbeat.Idle), out.String())
}
