package hsdp

import "fmt"

// Plan is one rank's place in a world of Replicas x Shards ranks. The
// shard group of a rank is the block of Shards consecutive ranks it falls
// in (a node, by default), and its replica group is the ranks with the same
// shard index in every block. Shards = 1 is DDP, Replicas = 1 is FSDP.
type Plan struct {
	Rank     int // global rank
	Replicas int // copies of every shard: the size of a replica group
	Shards   int // slices every buffer is cut into: the size of a shard group
}

// NewPlan checks that rank is in a world of worldSize ranks that shards
// divides, and returns its Plan.
func NewPlan(rank, worldSize, shards int) (Plan, error) {
	switch {
	case worldSize < 1:
		return Plan{}, fmt.Errorf("hsdp: world size %d: must be at least 1", worldSize)
	case rank < 0 || rank >= worldSize:
		return Plan{}, fmt.Errorf("hsdp: rank %d outside world size %d", rank, worldSize)
	case shards < 1 || worldSize%shards != 0:
		return Plan{}, fmt.Errorf("hsdp: shard size %d does not divide world size %d", shards, worldSize)
	}
	return Plan{Rank: rank, Replicas: worldSize / shards, Shards: shards}, nil
}

// WorldSize is Replicas x Shards.
func (p Plan) WorldSize() int { return p.Replicas * p.Shards }

// Shard is the index of the slice this rank owns, 0 .. Shards-1.
func (p Plan) Shard() int { return p.Rank % p.Shards }

// Replica is the index of this rank's shard group, 0 .. Replicas-1.
func (p Plan) Replica() int { return p.Rank / p.Shards }

// ShardGroup lists the global ranks that share out the buffers with this
// rank, in shard order: Replica()*Shards .. Replica()*Shards+Shards-1.
func (p Plan) ShardGroup() []int {
	g := make([]int, p.Shards)
	for s := range g {
		g[s] = p.Replica()*p.Shards + s
	}
	return g
}

// ReplicaGroup lists the global ranks that own the same slice as this
// rank, in replica order: Shard(), Shards+Shard(), 2*Shards+Shard(), ...
func (p Plan) ReplicaGroup() []int {
	g := make([]int, p.Replicas)
	for r := range g {
		g[r] = r*p.Shards + p.Shard()
	}
	return g
}

// Owned is the slice [lo, hi) of a buffer of n elements that this rank
// owns. n must be a multiple of Shards (see model.Layout.PaddedSize).
func (p Plan) Owned(n int) (lo, hi int) {
	per := n / p.Shards
	return p.Shard() * per, (p.Shard() + 1) * per
}
