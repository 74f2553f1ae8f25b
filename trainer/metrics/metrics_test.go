package metrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/profile"
)

func TestProgressLine(t *testing.T) {
	cases := []struct {
		p    Progress
		want string
	}{
		{Progress{Step: 120, Steps: 200, Loss: 2.4123, LR: 1.2e-3, TokensPerS: 5123.4, MFU: 0.3141, ETA: 80*time.Second + 300*time.Millisecond},
			"step 120/200 loss 2.41 lr 1.2e-03 tok/s 5123 mfu 0.31 eta 1m20s"},
		{Progress{Step: 1, Steps: 20, Loss: 5.5452, LR: 1.5e-4, TokensPerS: 0, ETA: 0},
			"step 1/20 loss 5.55 lr 1.5e-04 tok/s 0 mfu 0.00 eta 0s"},
		{Progress{Step: 5, Steps: 9, Loss: math.NaN(), LR: 3e-3, TokensPerS: 12.6, ETA: 2*time.Hour + 3*time.Second},
			"step 5/9 loss NaN lr 3.0e-03 tok/s 13 mfu 0.00 eta 2h0m3s"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, tc.p.String())
	}
}

func TestETA(t *testing.T) {
	require.Equal(t, 80*time.Second, ETA(120*time.Second, 120, 80))
	require.Equal(t, time.Duration(0), ETA(time.Minute, 0, 10))
	require.Equal(t, time.Duration(0), ETA(time.Minute, 10, 0))
}

func TestShouldLog(t *testing.T) {
	var logged []int
	for s := 1; s <= 25; s++ {
		if ShouldLog(s, 10, 25) {
			logged = append(logged, s)
		}
	}
	require.Equal(t, []int{1, 10, 20, 25}, logged)
	require.False(t, ShouldLog(3, 0, 5))
}

func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

func TestWriterAppendsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "metrics.jsonl")
	w, err := Open(path, 0)
	require.NoError(t, err)
	require.Equal(t, path, w.Path())
	require.NoError(t, w.Write(Record{Step: 12, Time: time.UnixMilli(1712345678120), Loss: 3.41, LR: 0.0006, TokensPerS: 5123.4, MFU: 0.31, WorldSize: 4, ElapsedS: 1.5}))
	// Flushed line by line: the line is in the file before Close.
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, `{"step":12,"time":1712345678.120,"loss":3.41,"lr":0.0006,"tokens_per_s":5123.4,"mfu":0.31,"world_size":4,"rank":0,"round":0,"elapsed_s":1.5}`+"\n", string(b))
	require.NoError(t, w.Write(Record{Step: 13, Loss: math.NaN(), LR: 1e-3, WorldSize: 4, GradNorm: 0.5, ValLoss: 2.5}))
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	require.ErrorContains(t, w.Write(Record{Step: 14}), "closed")

	// A run resumed at step 14 appends; its round is marked.
	before := time.Now()
	w, err = Open(path, 0)
	require.NoError(t, err)
	require.NoError(t, w.Write(Record{Step: 14, Loss: 3, WorldSize: 2, Round: 3}))
	require.NoError(t, w.Close())
	lines := readLines(t, path)
	require.Len(t, lines, 3)
	require.Nil(t, lines[1]["loss"])
	require.Equal(t, 0.5, lines[1]["grad_norm"])
	require.Equal(t, 2.5, lines[1]["val_loss"])
	require.Equal(t, 14.0, lines[2]["step"])
	require.Equal(t, 3.0, lines[2]["round"])
	require.NotContains(t, lines[2], "grad_norm")
	require.InDelta(t, float64(before.UnixMilli())/1e3, lines[2]["time"], 60, "a zero Time is the time of the write")
}

func TestWriterRanks(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "m.jsonl")
	w1, err := Open(shared, 1)
	require.NoError(t, err)
	require.Empty(t, w1.Path(), "rank 1 does not write a shared file")
	require.NoError(t, w1.Write(Record{Step: 1}))
	require.NoError(t, w1.Close())
	require.NoFileExists(t, shared)

	none, err := Open("", 0)
	require.NoError(t, err)
	require.NoError(t, none.Write(Record{Step: 1}))
	require.NoError(t, none.Close())

	perRank := filepath.Join(dir, "rank{rank}", "m-{rank}.jsonl")
	for rank := range 3 {
		w, err := Open(perRank, rank)
		require.NoError(t, err)
		require.NoError(t, w.Write(Record{Step: 1, Rank: rank, WorldSize: 3}))
		require.NoError(t, w.Close())
	}
	lines := readLines(t, filepath.Join(dir, "rank2", "m-2.jsonl"))
	require.Equal(t, 2.0, lines[0]["rank"])

	require.NoError(t, os.WriteFile(shared, nil, 0o644))
	_, err = Open(filepath.Join(shared, "under-a-file", "m.jsonl"), 0)
	require.ErrorContains(t, err, "metrics: open")
}

func TestWriterConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	w, err := Open(path, 0)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				require.NoError(t, w.Write(Record{Step: g*100 + i, Loss: 1}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())
	require.Len(t, readLines(t, path), 200)
}

// TestOpenKeepsEveryRecord: a run that goes on from any step, earlier
// ones included, appends after every record the file holds; only a torn
// last line (no newline: never a whole record) is cut, so that the new
// records start their own lines.
func TestOpenKeepsEveryRecord(t *testing.T) {
	rec := func(step int) string { return fmt.Sprintf(`{"step":%d,"time":1.5,"loss":2}`+"\n", step) }
	recs := func(from, to int) string {
		var b strings.Builder
		for s := from; s <= to; s++ {
			b.WriteString(rec(s))
		}
		return b.String()
	}
	long := `{"step":9,"pad":"` + strings.Repeat("x", 10_000)
	cases := []struct {
		name    string
		content *string // nil: no file
		want    string  // what stays before the new record
		last    int     // LastStep once opened
	}{
		{"no file", nil, "", 0},
		{"a rollback keeps the records it redoes", ptr(recs(1, 15)), recs(1, 15), 15},
		{"torn last line", ptr(recs(1, 7) + `{"step":8,"ti`), recs(1, 7), 7},
		{"a torn line longer than a read", ptr(recs(1, 2) + long), recs(1, 2), 2},
		{"nothing but a torn line", ptr(`{"step":1,`), "", 0},
		{"empty", ptr(""), "", 0},
		{"a last line that is no record", ptr(recs(1, 4) + "not json\n"), recs(1, 4) + "not json\n", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.jsonl")
			if tc.content != nil {
				require.NoError(t, os.WriteFile(path, []byte(*tc.content), 0o644))
			}
			w, err := Open(path, 0)
			require.NoError(t, err)
			require.Equal(t, tc.last, w.LastStep(), "the file's last step")
			require.NoError(t, w.Write(Record{Step: 3, Time: time.UnixMilli(1500), Loss: 1, Round: 2}))
			require.Equal(t, 3, w.LastStep(), "the step written last")
			require.NoError(t, w.Close())
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, tc.want+`{"step":3,"time":1.500,"loss":1,"lr":0,"tokens_per_s":0,"mfu":0,"world_size":0,"rank":0,"round":2,"elapsed_s":0}`+"\n", string(b))
		})
	}
}

func TestOpenUnreadable(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(dir, 0)
	require.ErrorContains(t, err, "metrics: open")
}

func ptr(s string) *string { return &s }

func TestWriterProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := Open(path, 0)
	require.NoError(t, err)
	st := profile.Step{Total: 500 * time.Millisecond}
	st.Phases[profile.GEMM] = 300 * time.Millisecond
	st.Phases[profile.Waiting] = 200 * time.Millisecond
	require.NoError(t, w.Write(Record{Step: 1, Profile: &st}))
	require.NoError(t, w.Write(Record{Step: 2}))
	require.NoError(t, w.Close())
	lines := readLines(t, path)
	require.Equal(t, map[string]any{"gemm_s": 0.3, "attention_s": 0.0, "elementwise_s": 0.0, "optimizer_s": 0.0,
		"collectives_s": 0.0, "waiting_s": 0.2, "step_s": 0.5}, lines[0]["profile"])
	require.NotContains(t, lines[1], "profile", "a record without a profile has no profile key")
}
