package memcopy

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/recovery"
)

// BenchmarkSnapshot is the cost per step of memory copies on 3 nodes x 2
// ranks, with one and with two replicas (memory_replicas) side by side:
// every rank snapshots its fsdp shard (params, m and v) of the model of
// examples/train.toml, or of a larger shard, and waits for the exchange.
// ns/op is one step's exchange end to end (what a step must outlast for
// the copy to be free); block-ns/op is how long Snapshot held the calling
// rank (the copy into the Keeper's buffer); MB/s is one rank's shard bytes
// per exchange. tcp runs every link over loopback TCP, as between nodes;
// unix uses this node's Unix sockets and shared memory.
func BenchmarkSnapshot(b *testing.B) {
	cfg, err := config.Load(filepath.Join("..", "..", "examples", "train.toml"), nil)
	require.NoError(b, err)
	const size, perNode = 6, 2
	example := int((cfg.Model.Params() + size - 1) / size)
	for _, n := range []int{example, 4 << 20} {
		for _, tcp := range []bool{true, false} {
			for _, replicas := range []int{1, 2} {
				link := "unix"
				if tcp {
					link = "tcp"
				}
				b.Run(fmt.Sprintf("elems=%d/%s/replicas=%d", n, link, replicas), func(b *testing.B) {
					benchSnapshot(b, startReplicas(b, size, perNode, replicas, tcp), n)
				})
			}
		}
	}
}

// benchSnapshot snapshots every rank's shard of n elements b.N times.
func benchSnapshot(b *testing.B, j *job, n int) {
	size := len(j.keepers)
	shards := make([]recovery.Slice, size)
	for r := range shards {
		shards[r] = shard(r, 0, n)
	}
	b.SetBytes(int64(12 * n))
	var blocked time.Duration
	b.ResetTimer()
	for i := range b.N {
		for r, k := range j.keepers {
			shards[r].Step = int64(i + 1)
			t0 := time.Now()
			if err := k.Snapshot(shards[r]); err != nil {
				b.Fatal(err)
			}
			blocked += time.Since(t0)
		}
		for _, k := range j.keepers {
			if err := k.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(blocked.Nanoseconds())/float64(b.N*size), "block-ns/op")
}
