package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/recovery"
)

// TestRunSavesEachStep: a worker with the agent's snapshot directory
// leaves its rank's last two steps in its two slots, the newest its final
// state bit for bit (the parameters DumpParams wrote), as the trainer's
// own payload of its slice; a missing directory or a file in its place is
// a usage error.
func TestRunSavesEachStep(t *testing.T) {
	cfg := tinyConfig(t)
	dir, dump := t.TempDir(), filepath.Join(t.TempDir(), "dump")
	var stderr bytes.Buffer
	require.NoError(t, Run(context.Background(), Options{Config: cfg, LookupEnv: envOf("WORLD_SIZE=1", snapshot.EnvDir+"="+dir),
		Threads: 1, DumpParams: dump, Stderr: &stderr}))
	require.NotContains(t, stderr.String(), "offering", "a fresh job has nothing saved to offer")

	var steps []uint64
	for _, p := range snapshot.Paths(dir, 0) {
		s, err := snapshot.Verify(p)
		require.NoError(t, err)
		require.Equal(t, 1, s.World)
		require.True(t, s.Replicated(), "one shard: the state is the whole model")
		steps = append(steps, s.Step)
	}
	require.ElementsMatch(t, []uint64{19, 20}, steps)

	paths := snapshot.Paths(dir, 0)
	newest, err := snapshot.Newest(paths[:]...)
	require.NoError(t, err)
	payload, err := snapshot.ReadPayload(newest)
	require.NoError(t, err)
	run := recovery.Run{Config: cfg.Hash(), Size: savedSize(t, payload)}
	s, err := recovery.ParseSaved(newest.Step, payload, run)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dump, "rank-0.bin"))
	require.NoError(t, err)
	require.Len(t, s.Params, len(b)/4)
	for i, p := range s.Params {
		require.Equal(t, binary.LittleEndian.Uint32(b[4*i:]), math.Float32bits(p), "param %d", i)
	}

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for name, bad := range map[string]string{"missing": filepath.Join(dir, "nowhere"), "a file": file} {
		t.Run(name, func(t *testing.T) {
			err := Run(context.Background(), Options{Config: cfg, LookupEnv: envOf("WORLD_SIZE=1", snapshot.EnvDir+"="+bad), Threads: 1})
			var xe *ExitError
			require.ErrorAs(t, err, &xe)
			require.Equal(t, ExitUsage, xe.Code)
			require.ErrorContains(t, err, "worker: "+snapshot.EnvDir+"="+bad+": ")
			require.ErrorContains(t, err, "unset it to run without snapshots")
		})
	}
}

// savedSize reads the model size a saved payload records (bytes 32..40).
func savedSize(t *testing.T, payload []byte) int {
	t.Helper()
	require.Greater(t, len(payload), 40)
	return int(binary.LittleEndian.Uint64(payload[32:]))
}

// TestTakeOver: a restarted worker offers every complete slot of its
// rank that holds this run's state, the newest first; a slot torn by a
// save cut short, a missing one, or another rank's is none, and one whose
// payload is corrupt or of another run is none either and said.
func TestTakeOver(t *testing.T) {
	run := recovery.Run{Config: strings.Repeat("0123456789abcdef", 4), Size: 6}
	other := recovery.Run{Config: strings.Repeat("fedcba9876543210", 4), Size: 6}
	slice := func(step int64) recovery.Slice {
		s := recovery.Make(step, 2, 5)
		for i := range s.Params {
			s.Params[i], s.M[i], s.V[i] = float32(step)+float32(i), float32(i), 1/float32(step+1)
		}
		return s
	}
	// write saves slices of rank as RankSlots does (slot 0 first).
	write := func(t *testing.T, dir string, rank int, r recovery.Run, ss ...recovery.Slice) {
		t.Helper()
		w, err := snapshot.OpenRank(dir, rank)
		require.NoError(t, err)
		defer w.Close()
		for _, s := range ss {
			require.NoError(t, w.Write(snapshot.Header{Step: uint64(s.Step), Length: uint64(recovery.SavedLen(s.Len())), World: 2}, s.Saved(r)))
		}
	}
	// edit changes the file of rank 1's slot i.
	edit := func(t *testing.T, dir string, i int, f func(b []byte)) {
		t.Helper()
		p := snapshot.Paths(dir, 1)[i]
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		f(b)
		require.NoError(t, os.WriteFile(p, b, 0o600))
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		steps []int64
		warns string
	}{
		{"nothing saved", func(*testing.T, string) {}, nil, ""},
		{"another rank's only", func(t *testing.T, dir string) { write(t, dir, 0, run, slice(5)) }, nil, ""},
		{"two steps, the newest first", func(t *testing.T, dir string) { write(t, dir, 1, run, slice(5), slice(6)) }, []int64{6, 5}, ""},
		{"the newer in slot 0", func(t *testing.T, dir string) { write(t, dir, 1, run, slice(5), slice(6), slice(7)) }, []int64{7, 6}, ""},
		{"one", func(t *testing.T, dir string) { write(t, dir, 1, run, slice(5)) }, []int64{5}, ""},
		{"the newest torn (its header zeroed as a save begins)", func(t *testing.T, dir string) {
			write(t, dir, 1, run, slice(5), slice(6))
			edit(t, dir, 1, func(b []byte) { clear(b[:snapshot.HeaderLen]) })
		}, []int64{5}, ""},
		{"the newest corrupt (a payload bit flipped)", func(t *testing.T, dir string) {
			write(t, dir, 1, run, slice(5), slice(6))
			edit(t, dir, 1, func(b []byte) { b[snapshot.HeaderSize+150] ^= 1 })
		}, []int64{5}, "rank-1.slot1: snapshot: payload corrupt"},
		{"the newest cut short", func(t *testing.T, dir string) {
			write(t, dir, 1, run, slice(5), slice(6))
			p := snapshot.Paths(dir, 1)[1]
			require.NoError(t, os.Truncate(p, snapshot.HeaderSize+10))
		}, []int64{5}, "rank-1.slot1: snapshot: payload corrupt"},
		{"another run's", func(t *testing.T, dir string) { write(t, dir, 1, other, slice(5)) }, nil,
			"rank-1.slot0: recovery: a saved slice of another run: config hash fedcba987654"},
		{"one past the run's steps", func(t *testing.T, dir string) { write(t, dir, 1, run, slice(20), slice(21)) }, []int64{20},
			"rank-1.slot1: step 21, past this run's 20 steps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			var warn bytes.Buffer
			held, err := takeOver(dir, 1, run, 20, &warn)
			require.NoError(t, err)
			var steps []int64
			for _, s := range held {
				require.Equal(t, slice(s.Step), s, "step %d bit for bit", s.Step)
				steps = append(steps, s.Step)
			}
			require.Equal(t, tc.steps, steps)
			if tc.warns == "" {
				require.Empty(t, warn.String())
				return
			}
			require.Contains(t, warn.String(), "worker rank 1: not offering ")
			require.Contains(t, warn.String(), tc.warns)
		})
	}
	t.Run("an unreadable slot is an error", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(snapshot.Paths(dir, 1)[0], 0o700)) // a directory in a slot's place
		_, err := takeOver(dir, 1, run, 20, io.Discard)
		require.ErrorContains(t, err, "worker rank 1: read its saved state: ")
	})
}

// BenchmarkSave is the cost of one rank's save after a step: a slice of
// n elements (12n bytes of payload) written into a slot in /dev/shm (the
// tmpfs the agent's directory lives in) with its CRC-32, as rankSlots.save
// does it; the rate is the payload's bytes.
func BenchmarkSave(b *testing.B) {
	run := recovery.Run{Config: strings.Repeat("0123456789abcdef", 4), Size: 1 << 30}
	for _, n := range []int{1 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("%dM elements", n>>20), func(b *testing.B) {
			dir, err := os.MkdirTemp("/dev/shm", "trainer-bench-")
			if err != nil {
				dir = b.TempDir()
			} else {
				b.Cleanup(func() { os.RemoveAll(dir) })
			}
			w, err := snapshot.OpenRank(dir, 0)
			require.NoError(b, err)
			b.Cleanup(func() { w.Close() })
			s := recovery.Make(0, 0, n)
			b.SetBytes(int64(recovery.SavedLen(n)))
			for i := 0; b.Loop(); i++ {
				s.Step = int64(i)
				require.NoError(b, w.Write(snapshot.Header{Step: uint64(i), Length: uint64(recovery.SavedLen(n)), World: 2}, s.Saved(run)))
			}
		})
	}
}

// BenchmarkSnapshotCost is what the save after every step costs beside the
// step, measured in one run so that both see the same machine: a rank
// whose slice is a model of 12.8M parameters (4 layers, d_model 512; a
// save of 153 MB) trains 512 or 2048 tokens a step, and saves
// (rankSlots.save, into /dev/shm) after every other step. It reports the
// median step without its save (from the end of one AfterStep to the
// start of the next; and that after a save, what it leaves behind in the
// caches), the median save, the save as a percentage of the step, its
// rate, and the rate of a plain copy of the same bytes in memory right
// after it. The cost scales with the slice over the tokens a rank trains
// a step: 12 bytes an element against some 6 FLOPs an element a token.
func BenchmarkSnapshotCost(b *testing.B) {
	for _, batch := range []int{8, 32} {
		b.Run(fmt.Sprintf("%d tokens a step", batch*64), func(b *testing.B) { snapshotCost(b, batch) })
	}
}

// snapshotCost is BenchmarkSnapshotCost for a global batch of batch
// sequences of 64 tokens.
func snapshotCost(b *testing.B, batch int) {
	const steps = 13
	cfg := tinyConfig(b, "model.layers=4", "model.d_model=512", "model.heads=8", "model.context=64",
		fmt.Sprintf("train.global_batch=%d", batch), "train.micro_batch=4", fmt.Sprintf("train.steps=%d", steps),
		"optim.warmup=2", "train.log_every=100")
	dir, err := os.MkdirTemp("/dev/shm", "trainer-bench-")
	if err != nil {
		dir = b.TempDir()
	} else {
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	var afterSave, afterNone, saves, copies []time.Duration
	var elems int
	var buf []float32
	for b.Loop() {
		slots, err := openSlots(dir, 0)
		require.NoError(b, err)
		var last time.Time
		saved := false
		tr, err := trainer.New(context.Background(), trainer.Config{Train: cfg, Worker: distenv.Worker{WorldSize: 1, LocalWorldSize: 1},
			AfterStep: func(t *trainer.Trainer, rec metrics.Record) error {
				now := time.Now()
				if rec.Step > 2 { // the first steps warm up
					if saved {
						afterSave = append(afterSave, now.Sub(last))
					} else {
						afterNone = append(afterNone, now.Sub(last))
					}
				}
				saved = rec.Step%2 == 0
				if saved {
					st := t.State()
					elems = st.Len()
					if err := slots.save(t); err != nil {
						return err
					}
					saves = append(saves, time.Since(now))
					if buf == nil {
						buf = make([]float32, 3*elems)
						copy(buf, st.Params) // its pages, as the slot's are
					}
					c := time.Now()
					copy(buf[copy(buf[copy(buf, st.Params):], st.M)+elems:], st.V)
					copies = append(copies, time.Since(c))
				}
				last = time.Now()
				return nil
			}})
		require.NoError(b, err)
		_, err = tr.Run(context.Background())
		require.NoError(b, err)
		require.NoError(b, errors.Join(tr.Close(), slots.close()))
	}
	median := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2]) / float64(time.Millisecond)
	}
	step := median(afterNone)
	b.ReportMetric(step, "step-ms")
	b.ReportMetric(median(afterSave), "step-after-save-ms")
	b.ReportMetric(median(saves), "save-ms")
	b.ReportMetric(100*median(saves)/step, "save-%")
	b.ReportMetric(float64(recovery.SavedLen(elems))/median(saves)/1e6, "save-GB/s")
	b.ReportMetric(float64(12*elems)/median(copies)/1e6, "memcpy-GB/s")
}
