package durable

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/snapshot"
)

// BenchmarkPersist100MB measures one durable copy of a 100 MB slot from
// /dev/shm to the test's temporary directory, as Persist makes it (CRC
// check, fsync, read back and verify, rename, fsync of the directory), and
// beside it: the part of it that reads the slot (the time the worker must
// not overwrite it: the CRC-checked copy into the page cache, before the
// fsync), a plain copy and fsync of the same bytes, and the whole copy to
// another directory in /dev/shm (no disk: its CPU cost). cpu-s/op is the
// process's user and system CPU time a copy; cpu-cores, that over the wall
// time.
//
//	go test -run '^$' -bench Persist100MB -benchtime 10x ./internal/snapshot/durable
func BenchmarkPersist100MB(b *testing.B) {
	const size = 100 << 20
	src, err := os.MkdirTemp("/dev/shm", "gorun-durable-bench-")
	require.NoError(b, err)
	b.Cleanup(func() { os.RemoveAll(src) })
	slots, err := snapshot.OpenRank(src, 0)
	require.NoError(b, err)
	b.Cleanup(func() { slots.Close() })
	require.NoError(b, slots.Write(snapshot.Header{Step: 1, Length: size, World: 1}, bytes.NewReader(payload(0, 1, size))))
	paths := snapshot.Paths(src, 0)
	s, err := snapshot.Newest(paths[:]...)
	require.NoError(b, err)
	dst := b.TempDir()
	p, err := newPersister(src, []int{0}, dst, 1, 1, zerolog.Nop())
	require.NoError(b, err)
	final := filepath.Join(dst, stepDir(1), slotName(0))

	b.Run("persist", func(b *testing.B) {
		measure(b, size, func() {
			require.NoError(b, p.copy(context.Background(), s, final))
			require.NoError(b, os.Remove(final))
		})
	})
	b.Run("reading the slot", func(b *testing.B) {
		measure(b, size, func() {
			out, err := os.Create(final)
			require.NoError(b, err)
			require.NoError(b, p.copySlot(context.Background(), s, out))
			require.NoError(b, out.Close())
			require.NoError(b, os.Remove(final))
		})
	})
	b.Run("persist to /dev/shm", func(b *testing.B) {
		shm, err := os.MkdirTemp("/dev/shm", "gorun-durable-bench-dst-")
		require.NoError(b, err)
		defer os.RemoveAll(shm)
		p, err := newPersister(src, []int{0}, shm, 1, 1, zerolog.Nop())
		require.NoError(b, err)
		final := filepath.Join(shm, stepDir(1), slotName(0))
		measure(b, size, func() {
			require.NoError(b, p.copy(context.Background(), s, final))
			require.NoError(b, os.Remove(final))
		})
	})
	b.Run("plain copy and fsync", func(b *testing.B) {
		measure(b, size, func() {
			in, err := os.Open(s.Path)
			require.NoError(b, err)
			out, err := os.Create(final)
			require.NoError(b, err)
			_, err = io.CopyBuffer(out, io.LimitReader(in, snapshot.HeaderSize+size), make([]byte, chunk))
			require.NoError(b, err)
			require.NoError(b, out.Sync())
			require.NoError(b, out.Close())
			require.NoError(b, in.Close())
			require.NoError(b, os.Remove(final))
		})
	})
}

// measure runs copy b.N times and reports its throughput and CPU time.
func measure(b *testing.B, size int64, copy func()) {
	b.SetBytes(snapshot.HeaderSize + size)
	var before, after unix.Rusage
	require.NoError(b, unix.Getrusage(unix.RUSAGE_SELF, &before))
	start := time.Now()
	for b.Loop() {
		copy()
	}
	wall := time.Since(start)
	require.NoError(b, unix.Getrusage(unix.RUSAGE_SELF, &after))
	cpu := time.Duration(after.Utime.Nano() - before.Utime.Nano() + after.Stime.Nano() - before.Stime.Nano())
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-cores")
}

// BenchmarkScan measures a scan of a durable directory of 4 ranks x 2
// steps of 64 MiB each (512 MiB, in the page cache): what node rank 0 does
// at every round's agreement when --snapshot-durable is set. Scan reads
// headers only; the payloads are checked by Load, for the snapshot
// restored.
//
//	go test -run '^$' -bench Scan -benchtime 5x ./internal/snapshot/durable
func BenchmarkScan(b *testing.B) {
	const size, ranks = 64 << 20, 4
	dst := b.TempDir()
	for _, step := range []uint64{2, 4} {
		require.NoError(b, os.MkdirAll(filepath.Join(dst, stepDir(step)), 0o700))
		for r := range ranks {
			src := b.TempDir()
			slots, err := snapshot.OpenRank(src, r)
			require.NoError(b, err)
			require.NoError(b, slots.Write(snapshot.Header{Step: step, Length: size, World: ranks}, bytes.NewReader(payload(r, step, size))))
			require.NoError(b, slots.Close())
			paths := snapshot.Paths(src, r)
			s, err := snapshot.Newest(paths[:]...)
			require.NoError(b, err)
			require.NoError(b, os.Rename(s.Path, filepath.Join(dst, stepDir(step), slotName(r))))
		}
	}
	for b.Loop() {
		hs, err := Scan(dst)
		require.NoError(b, err)
		require.Len(b, hs, 2*ranks)
	}
}
