package metrics

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ReadFile gives back what Writer wrote: every figure, null as NaN, the
// time to the millisecond.
func TestReadFileReadsWhatWriterWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := Open(path, 0)
	require.NoError(t, err)
	at := time.UnixMilli(1712345678123)
	want := []Record{
		{Step: 1, Time: at, Loss: 5.5, LR: 1e-3, TokensPerS: 5000, MFU: 0.2, WorldSize: 2, ElapsedS: 0.5, GradNorm: 2.25, ValLoss: math.NaN()},
		{Step: 2, Time: at.Add(time.Second), Loss: math.NaN(), LR: 2e-3, TokensPerS: 6000, MFU: 0.25, WorldSize: 1, ElapsedS: 0.1, GradNorm: 1.5, ValLoss: 4.5},
	}
	for _, r := range want {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Close())
	got, err := ReadFile(path)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, want[i].Time.Equal(got[i].Time), "time of record %d", i)
		want[i].Time, got[i].Time = time.Time{}, time.Time{}
		require.Equal(t, strings.ReplaceAll(fmtRecord(want[i]), "NaN", "?"), strings.ReplaceAll(fmtRecord(got[i]), "NaN", "?"))
	}
}

func fmtRecord(r Record) string { return string(r.appendJSON(nil)) }

func TestReadFileErrors(t *testing.T) {
	rec := `{"step":1,"time":1.5,"loss":2,"world_size":1}` + "\n"
	cases := []struct {
		name    string
		content *string // nil: no file
		want    string  // "" for no error
		records int
	}{
		{"missing", nil, "metrics: read FILE: no such file: the trainer writes it where [train] metrics (or gorun's --metrics) says, metrics.jsonl next to the train.toml by default", 0},
		{"empty", ptr(""), "metrics: read FILE: no records: the file is empty (the trainer writes one line per step once the first step ends)", 0},
		{"blank lines only", ptr("\n  \n"), "metrics: read FILE: no records: the file is empty (the trainer writes one line per step once the first step ends)", 0},
		{"not JSON on line 2", ptr(rec + "hello\n" + rec), `metrics: read FILE:2: not a JSON object: invalid character 'h' looking for beginning of value; want one JSON object a line as the trainer writes, e.g. {"step":12,"time":1712345678.123,"loss":3.41,...}`, 0},
		{"no step on line 1", ptr(`{"loss":2}` + "\n"), `metrics: read FILE:1: no "step"; want one JSON object a line as the trainer writes, e.g. {"step":12,"time":1712345678.123,"loss":3.41,...}`, 0},
		{"fractional step", ptr(`{"step":1.5}` + "\n"), `metrics: read FILE:1: "step" 1.5 is not a whole number; want one JSON object a line as the trainer writes, e.g. {"step":12,"time":1712345678.123,"loss":3.41,...}`, 0},
		{"a JSON array", ptr("[1,2]\n"), "metrics: read FILE:1: not a JSON object: json: cannot unmarshal array into Go value of type metrics.jsonRecord; want one JSON object a line as the trainer writes, e.g. {\"step\":12,\"time\":1712345678.123,\"loss\":3.41,...}", 0},
		{"torn last line is left out", ptr(rec + rec + `{"step":3,"ti`), "", 2},
		{"whole last line without newline", ptr(rec + strings.TrimSuffix(rec, "\n")), "", 2},
		{"long line", ptr(`{"step":1,"pad":"` + strings.Repeat("x", 200_000) + `"}` + "\n" + rec), "", 2},
		{"too long a line", ptr(rec + strings.Repeat("x", 2<<20)), "metrics: read FILE:2: a line longer than 1048576 bytes: not a metrics file", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.jsonl")
			if tc.content != nil {
				require.NoError(t, os.WriteFile(path, []byte(*tc.content), 0o644))
			}
			recs, err := ReadFile(path)
			if tc.want != "" {
				require.EqualError(t, err, strings.ReplaceAll(tc.want, "FILE", path))
				return
			}
			require.NoError(t, err)
			require.Len(t, recs, tc.records)
		})
	}
}

// TestHistory: the records of every world, in file order, give the line
// of steps the job's last state went through; what is left out is what
// the job redid.
func TestHistory(t *testing.T) {
	recs := func(round int, steps ...int) []Record {
		var out []Record
		for _, s := range steps {
			out = append(out, Record{Step: s, Round: round})
		}
		return out
	}
	cases := []struct {
		name string
		recs []Record
		want []Record
	}{
		{"none", nil, nil},
		{"one world", recs(0, 1, 2, 3), recs(0, 1, 2, 3)},
		{"a rollback replaces the steps it redoes", slices.Concat(recs(0, 1, 2, 3, 4, 5), recs(1, 4, 5, 6)),
			slices.Concat(recs(0, 1, 2, 3), recs(1, 4, 5, 6))},
		{"a rollback below steps no later world reached drops them too", slices.Concat(recs(0, 1, 2, 3, 4, 5), recs(1, 3)),
			slices.Concat(recs(0, 1, 2), recs(1, 3))},
		{"rollbacks in a row", slices.Concat(recs(0, 1, 2, 3, 4), recs(1, 3, 4, 5, 6), recs(2, 2, 3)),
			slices.Concat(recs(0, 1), recs(2, 2, 3))},
		{"a stale world's rank joins later: a gap", slices.Concat(recs(0, 1, 2), recs(2, 7, 8)),
			slices.Concat(recs(0, 1, 2), recs(2, 7, 8))},
		{"a new run of the same file", slices.Concat(recs(0, 1, 2, 3), recs(0, 1, 2)), recs(0, 1, 2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.recs)
			require.Equal(t, tc.want, History(tc.recs))
			require.Equal(t, in, tc.recs, "History changes nothing it reads")
		})
	}
}
