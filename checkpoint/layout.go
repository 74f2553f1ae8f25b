package checkpoint

import (
	"fmt"
	"strconv"
	"strings"
)

// Names of the files and directories of a checkpoint directory.
const (
	// ManifestName is the file whose presence makes a step directory a checkpoint.
	ManifestName = "manifest.json"
	stepPrefix   = "step-"
	tmpPrefix    = ".tmp-" + stepPrefix
	oldPrefix    = ".old-" + stepPrefix
)

// World is the layout of the ranks that save or load a checkpoint: Replicas x Shards ranks,
// rank = replica*Shards + shard (shards inside a replica group are consecutive ranks). Every rank
// of one shard index holds the same part of every tensor.
type World struct {
	Replicas int `json:"replicas"`
	Shards   int `json:"shards"`
	// Mode is informational (hsdp, fsdp, ddp); it does not change how data is written.
	Mode string `json:"mode,omitempty"`
}

// Validate reports a layout with fewer than one replica or shard.
func (w World) Validate() error {
	if w.Replicas < 1 || w.Shards < 1 {
		return fmt.Errorf("checkpoint: world %dx%d: replicas and shards must be at least 1", w.Replicas, w.Shards)
	}
	return nil
}

// Size is the number of ranks, Replicas*Shards.
func (w World) Size() int { return w.Replicas * w.Shards }

// Coords returns the replica and shard index of rank.
func (w World) Coords(rank int) (replica, shard int) { return rank / w.Shards, rank % w.Shards }

// String formats the layout as "RxS mode", e.g. "2x2 hsdp".
func (w World) String() string {
	s := fmt.Sprintf("%dx%d", w.Replicas, w.Shards)
	if w.Mode != "" {
		s += " " + w.Mode
	}
	return s
}

// ShardRange returns the element range [lo, hi) of a flat tensor of n elements that shard of
// shards owns when the tensor is padded to a multiple of shards: every shard owns ceil(n/shards)
// elements of the padded buffer, i.e. [shard*padded/shards, (shard+1)*padded/shards), clipped to
// n, so the last shards may own fewer elements or none. Save and load agree on it for any layout;
// out-of-range arguments give an empty range.
func ShardRange(n int64, shard, shards int) (lo, hi int64) {
	if n <= 0 || shards < 1 || shard < 0 || shard >= shards {
		return 0, 0
	}
	per := (n + int64(shards) - 1) / int64(shards)
	lo = min(int64(shard)*per, n)
	hi = min(lo+per, n)
	return lo, hi
}

// StepName is the directory name of the checkpoint of step: step-%08d, e.g. step-00001200.
func StepName(step int64) string { return fmt.Sprintf("%s%08d", stepPrefix, step) }

// ParseStep returns the step of a directory named by StepName, and false for any other name.
func ParseStep(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, stepPrefix)
	if !ok || len(digits) < 8 {
		return 0, false
	}
	step, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || step < 0 {
		return 0, false
	}
	return step, true
}

// shardFileName is the data file of the rank that writes it.
func shardFileName(rank int) string { return fmt.Sprintf("shard-%05d.bin", rank) }
