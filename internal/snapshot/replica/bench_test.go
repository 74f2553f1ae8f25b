package replica

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/snapshot"
)

// benchSlot is the size of the slot BenchmarkPush copies: 100 MB.
const benchSlot = 100 << 20

// BenchmarkPush copies one rank's 100 MB slot to a peer over loopback TCP,
// as Push does for each new step once connected (sendfile out, CRC-32 and
// pwrite into the peer's RankSlots in), with both directories on /dev/shm
// like the agent's; memcpy is a plain copy of the same bytes beside it.
// MB/s is the payload rate; cpu-ms/op is this process's CPU time (user +
// system, sender and receiver together) per copy.
func BenchmarkPush(b *testing.B) {
	b.Run("memcpy", func(b *testing.B) {
		src, dst := make([]byte, benchSlot), make([]byte, benchSlot)
		for i := range src {
			src[i] = byte(i)
		}
		b.SetBytes(benchSlot)
		cpu := cpuTime(b)
		for b.Loop() {
			copy(dst, src)
		}
		reportCPU(b, cpu)
	})
	b.Run("push", func(b *testing.B) {
		src := newSender(b, shmDir(b))
		peerDir := shmDir(b)
		s, err := Serve("127.0.0.1:0", peerDir, testAuth, zerolog.Nop())
		require.NoError(b, err)
		defer s.Close()
		s.Accept(0, nil)
		src.save(b, 0, 1, benchSlot)
		p := newPusher(s.Addr(), 0, src.dir, []int{0}, testAuth.keys(), nil, zerolog.Nop())
		defer p.disconnect()
		ctx := context.Background()
		b.SetBytes(benchSlot)
		cpu := cpuTime(b)
		for b.Loop() {
			// A fresh poller reports the slot again: the header reads of
			// each new step are in the measure.
			slot, ok, err := snapshot.NewPoller(src.dir, 0).Poll()
			if err != nil || !ok {
				b.Fatalf("no complete slot: %v", err)
			}
			if err := p.send(ctx, 0, slot); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
}

// shmDir is a fresh directory on /dev/shm, removed when b ends.
func shmDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "gorun-replica-bench-")
	require.NoError(b, err)
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cpuTime is this process's CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per op since since.
func reportCPU(b *testing.B, since time.Duration) {
	now := cpuTime(b)
	b.ReportMetric(float64(now-since)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}
