package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// watched runs Watch on rank 0 of dir in a goroutine; each report arrives
// on reports, and found waits for a value on release when release is not
// nil. stop cancels the watch and returns Watch's error.
type watched struct {
	reports chan Slot
	stop    func() error
}

func watch(t *testing.T, dir string, release chan struct{}) watched {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := watched{reports: make(chan Slot)}
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, dir, 0, time.Millisecond, func(s Slot) error {
			select {
			case w.reports <- s:
			case <-ctx.Done():
				return nil
			}
			if release != nil {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		})
	}()
	w.stop = func() error {
		cancel()
		return <-done
	}
	return w
}

// steps reads n reports and returns their steps.
func (w watched) steps(n int) []uint64 {
	var out []uint64
	for range n {
		out = append(out, (<-w.reports).Step)
	}
	return out
}

func writeStep(t *testing.T, s *RankSlots, step uint64) {
	t.Helper()
	payload := bytes.Repeat([]byte{byte(step)}, 100+int(step))
	require.NoError(t, s.Write(Header{Step: step, Length: uint64(len(payload)), World: 1}, bytes.NewReader(payload)))
}

func TestWatchReportsEachNewSnapshot(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	w := watch(t, dir, nil)
	s, err := OpenRank(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	for step := uint64(1); step <= 4; step++ {
		writeStep(t, s, step)
		got := <-w.reports
		require.Equal(t, step, got.Step)
		require.Equal(t, Paths(dir, 0)[(step-1)%2], got.Path, "step %d", step)
		v, err := Verify(got.Path)
		require.NoError(t, err)
		require.Equal(t, v.Header, got.Header)
	}
	// A save cut short (its header zeroed) is no snapshot: the next report
	// is the next complete one.
	f, err := os.OpenFile(Paths(dir, 0)[0], os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(make([]byte, HeaderLen), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	s2, err := OpenRank(dir, 0)
	require.NoError(t, err)
	defer s2.Close()
	writeStep(t, s2, 5)
	require.Equal(t, []uint64{5}, w.steps(1))
	require.NoError(t, w.stop())
}

func TestWatchReportsTheNewestOnly(t *testing.T) {
	defer goleak.VerifyNone(t)
	tests := []struct {
		name   string
		before []uint64 // written before Watch starts
		during []uint64 // written while found holds the first report
		after  uint64   // written last
		want   []uint64
	}{
		{"the newest already there, first", []uint64{5, 6}, nil, 7, []uint64{6, 7}},
		{"a slow consumer skips what it could not keep up with", []uint64{1}, []uint64{2, 3}, 4, []uint64{1, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenRank(dir, 0)
			require.NoError(t, err)
			defer s.Close()
			for _, step := range tt.before {
				writeStep(t, s, step)
			}
			release := make(chan struct{})
			w := watch(t, dir, release)
			got := w.steps(1)
			for _, step := range tt.during {
				writeStep(t, s, step)
			}
			release <- struct{}{}
			if len(tt.during) > 0 {
				got = append(got, w.steps(1)...)
				release <- struct{}{}
			}
			writeStep(t, s, tt.after)
			got = append(got, w.steps(1)...)
			close(release)
			require.Equal(t, tt.want, got)
			require.NoError(t, w.stop())
		})
	}
}

// A slot left with a higher step than the worker now saves (it restored an
// older agreed step) does not hide the new saves in the other slot.
func TestWatchSeesSavesBelowAStaleSlot(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	p := Paths(dir, 0)
	put := func(slot int, step uint64) {
		require.NoError(t, os.WriteFile(p[slot], encode(Header{Step: step, World: 1}, []byte{byte(step), 1, 2}), 0o600))
	}
	put(0, 380)
	put(1, 379)
	w := watch(t, dir, nil)
	require.Equal(t, []uint64{380}, w.steps(1))
	for _, step := range []uint64{200, 201, 202} {
		put(1, step)
		require.Equal(t, []uint64{step}, w.steps(1))
	}
	require.NoError(t, w.stop())
}

func TestWatchEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	s, err := OpenRank(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	writeStep(t, s, 1)
	stop := errors.New("enough")
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		ctx      context.Context
		interval time.Duration
		want     string // "" for nil
	}{
		{"an error of found is returned", context.Background(), time.Millisecond, "enough"},
		{"an ended context ends it before a poll", ended, time.Hour, ""},
		{"a poll interval of 0 is refused", context.Background(), 0, "watch of rank 0: poll interval 0s, want > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Watch(tt.ctx, dir, 0, tt.interval, func(Slot) error { return stop })
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestReadHeader(t *testing.T) {
	dir := t.TempDir()
	h := Header{Step: 7, World: 2, Rank: 1}
	whole := encode(h, []byte("payload"))
	tests := []struct {
		name    string
		content []byte // nil: no file
		want    error  // nil: h, Length and CRC as encode sets them
	}{
		{"whole (the payload is not read)", with(whole, func(b []byte) { b[HeaderSize] ^= 1 }), nil},
		{"no file", nil, fs.ErrNotExist},
		{"shorter than a header", whole[:HeaderLen-1], ErrIncomplete},
		{"zeroed: a save in progress", make([]byte, HeaderSize), ErrIncomplete},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, fmt.Sprint(i))
			if tt.content != nil {
				require.NoError(t, os.WriteFile(p, tt.content, 0o600))
			}
			got, err := ReadHeader(p)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				require.ErrorContains(t, err, p)
				return
			}
			require.NoError(t, err)
			want := h
			want.Length, want.CRC = 7, crc32.ChecksumIEEE([]byte("payload"))
			require.Equal(t, want, got)
		})
	}
}

// Poll, step by step: what each change of the slots makes it report.
func TestPollerReportsChangedSlotsOnly(t *testing.T) {
	dir := t.TempDir()
	paths := Paths(dir, 0)
	put := func(slot int, step uint64) func(*testing.T) {
		return func(t *testing.T) {
			require.NoError(t, os.WriteFile(paths[slot], encode(Header{Step: step, World: 1}, []byte{byte(step)}), 0o600))
		}
	}
	zero := func(slot int) func(*testing.T) {
		return func(t *testing.T) { require.NoError(t, os.WriteFile(paths[slot], make([]byte, HeaderSize), 0o600)) }
	}
	nothing := func(*testing.T) {}
	const none = ^uint64(0)
	steps := []struct {
		name string
		do   func(*testing.T)
		want uint64 // the step reported, none for no report
		err  string // in Poll's error, "" for none
	}{
		{"no files", nothing, none, ""},
		{"slot 0 complete", put(0, 1), 1, ""},
		{"nothing changed", nothing, none, ""},
		{"slot 1 complete", put(1, 2), 2, ""},
		{"slot 0 zeroed: a save begins", zero(0), none, ""},
		{"slot 0 complete again", put(0, 3), 3, ""},
		{"both rewritten between two polls: the newer only", func(t *testing.T) { put(1, 4)(t); put(0, 5)(t) }, 5, ""},
		{"a lower step than the other slot's", put(1, 2), 2, ""},
		{"the same header rewritten", put(1, 2), none, ""},
		{"slot 0 rewritten, slot 1 unreadable: an error", func(t *testing.T) {
			put(0, 6)(t)
			require.NoError(t, os.Remove(paths[1]))
			require.NoError(t, os.Mkdir(paths[1], 0o700))
		}, none, "is a directory"},
		{"slot 1 gone: what the failed poll saw is reported", func(t *testing.T) { require.NoError(t, os.Remove(paths[1])) }, 6, ""},
	}
	p := NewPoller(dir, 0)
	for _, s := range steps {
		s.do(t)
		got, ok, err := p.Poll()
		if s.err != "" {
			require.ErrorContains(t, err, s.err, s.name)
			continue
		}
		require.NoError(t, err, s.name)
		if s.want == none {
			require.False(t, ok, "%s: reported step %d", s.name, got.Step)
			continue
		}
		require.True(t, ok, s.name)
		require.Equal(t, s.want, got.Step, s.name)
	}
}
