package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/gorun/gorun/trainer/data"
)

// Vocab is the number of tokens the model knows: it reads bytes.
const Vocab = 256

// Config is one train.toml, decoded, overridden by --set, validated, with
// its relative paths made absolute (see Load). The zero value is not
// valid; start from Default.
type Config struct {
	Model      Model      `toml:"model"`
	Data       Data       `toml:"data"`
	Train      Train      `toml:"train"`
	Optim      Optim      `toml:"optim"`
	Parallel   Parallel   `toml:"parallel"`
	Checkpoint Checkpoint `toml:"checkpoint"`
	Elastic    Elastic    `toml:"elastic"`

	// rawFiles are data.files as written, before $VARS and the toml's
	// directory: the config hash uses them, so a run directory that moves
	// keeps its hash.
	rawFiles []string
}

// Model is [model]: the shape of the decoder-only transformer over bytes.
type Model struct {
	Layers  int `toml:"layers"`  // transformer blocks
	DModel  int `toml:"d_model"` // width of the residual stream
	Heads   int `toml:"heads"`   // attention heads; must divide DModel
	Context int `toml:"context"` // tokens (bytes) per sequence
}

// Data is [data]: the text the model reads.
type Data struct {
	// Files are glob patterns (with ** and {a,b}) or data.Builtin, the
	// corpus built into gorun; after Load the patterns are absolute with
	// $VARS expanded. Empty (or left out) means data.Builtin.
	Files []string `toml:"files"`
}

// Train is [train]: the length of the run, its batch and its logging.
type Train struct {
	Steps       int    `toml:"steps"`        // optimizer steps for the whole run
	GlobalBatch int    `toml:"global_batch"` // sequences per optimizer step, whole job
	MicroBatch  int    `toml:"micro_batch"`  // sequences per forward/backward on one rank
	Seed        uint64 `toml:"seed"`
	LogEvery    int    `toml:"log_every"` // steps between log lines
	// Metrics is the JSON-lines file rank 0 writes ("" for none; a
	// "{rank}" in it gives every rank its own file). Absolute after Load.
	Metrics string `toml:"metrics"`
	// Precision is the input format of the matrix products, PrecisionFP32
	// or PrecisionBF16; parameters, optimizer state, gradients and every
	// other operation stay fp32 either way.
	Precision string `toml:"precision"`
	// ActivationCheckpointing keeps only each transformer block's input
	// in the forward pass and recomputes the block's activations in the
	// backward pass (model.WithActivationCheckpointing): the activations
	// of one block instead of all of them, for up to about a fifth more
	// FLOPs a step (gorun estimate prints both). Off by default. It changes no bits, so it stays out of the
	// config hash.
	ActivationCheckpointing bool `toml:"activation_checkpointing"`
}

// Optim is [optim]: AdamW with linear warmup, then cosine decay to MinLR.
type Optim struct {
	LR          float64 `toml:"lr"`
	MinLR       float64 `toml:"min_lr"`
	Warmup      int     `toml:"warmup"` // steps of linear warmup
	Beta1       float64 `toml:"beta1"`
	Beta2       float64 `toml:"beta2"`
	Eps         float64 `toml:"eps"`
	WeightDecay float64 `toml:"weight_decay"`
	GradClip    float64 `toml:"grad_clip"` // global gradient norm cap; 0 turns clipping off
}

// Parallel is [parallel]: how the world is split into replicas x shards.
type Parallel struct {
	Mode      string `toml:"mode"`       // ddp | zero1 | zero2 | fsdp (zero3) | hsdp
	ShardSize int    `toml:"shard_size"` // 0: the number of workers per node
}

// Checkpoint is [checkpoint]: where and how often to save, to disk and
// to other ranks' memory.
type Checkpoint struct {
	Dir   string `toml:"dir"`   // absolute after Load
	Every int    `toml:"every"` // steps between saves; 0 saves only at the end
	Keep  int    `toml:"keep"`  // newest checkpoints kept
	Async bool   `toml:"async"` // write in the background
	// Memory keeps memory copies (package trainer/memcopy): after a
	// completed step each rank sends its shard of the parameters and of
	// AdamW to a buddy rank on the next node, in the background, so that a
	// layout without a surviving replica (fsdp across nodes) recovers from
	// memory after the loss of one node. Off by default. It changes no
	// math, so it stays out of the config hash.
	Memory bool `toml:"memory"`
	// MemoryEvery is the number of steps between memory copies (1: every
	// step). A recovery from memory redoes up to MemoryEvery steps.
	MemoryEvery int `toml:"memory_every"`
	// MemoryReplicas is how many other nodes hold each rank's memory copy
	// (1: the next node): the state survives that many nodes lost at once.
	// Each replica costs one more shard-sized transfer a copy and two
	// more shard-sized buffers a rank.
	MemoryReplicas int `toml:"memory_replicas"`
}

// Elastic is what the agent (gorun) reads from the config, not the
// workers: it changes no math and is not in the config hash.
type Elastic struct {
	// HeartbeatTimeout, a duration like "30s" ("" or "0s": off), is
	// gorun's --heartbeat-timeout for this job when the flag is not given.
	HeartbeatTimeout string `toml:"heartbeat_timeout"`
}

// Heartbeat is HeartbeatTimeout parsed (Validate has checked it).
func (e Elastic) Heartbeat() time.Duration {
	d, _ := time.ParseDuration(e.HeartbeatTimeout)
	return d
}

// Precisions of train.precision.
const (
	// PrecisionFP32 multiplies fp32 inputs: every run of the same config
	// gives the same bits whatever its world size.
	PrecisionFP32 = "fp32"
	// PrecisionBF16 rounds the inputs of every matrix product, forward
	// and backward, to bfloat16 and accumulates in fp32 (mixed precision
	// with fp32 master weights and AdamW state).
	PrecisionBF16 = "bf16"
)

// Parallel modes: what each rank keeps whole and what it keeps only its
// slice of (of a world-wide shard group, or of a shard group per node for
// hsdp). Every mode but ddp shards the optimizer state.
const (
	ModeHSDP  = "hsdp"  // zero3 within a shard group (a node), replicas across
	ModeFSDP  = "fsdp"  // zero3 over the whole world
	ModeZeRO3 = "zero3" // fsdp: parameters, gradients and optimizer state sharded
	ModeZeRO2 = "zero2" // gradients and optimizer state sharded, parameters whole
	ModeZeRO1 = "zero1" // optimizer state sharded, parameters and gradients whole
	ModeDDP   = "ddp"   // everything whole, gradients all-reduced
)

// modes lists the parallel modes as errors name them.
const modes = "ddp, zero1, zero2, fsdp (or zero3) or hsdp"

// ShardsParams says whether mode keeps only a slice of the parameters
// between uses, gathering them one unit at a time (zero3, fsdp, hsdp).
func ShardsParams(mode string) bool {
	return mode == ModeFSDP || mode == ModeZeRO3 || mode == ModeHSDP
}

// ShardsGrads says whether mode reduces each unit's gradient into the
// rank's slice as the backward pass leaves it (every mode but zero1 and
// ddp), rather than the whole gradient once the pass is done.
func ShardsGrads(mode string) bool { return ShardsParams(mode) || mode == ModeZeRO2 }

// Default returns the defaults of the train.toml of gorun's first design
// (config_test.go's design holds it, comments and all), which every key a
// file leaves out keeps. Its paths are still relative.
func Default() Config {
	c := Config{
		Model: Model{Layers: 2, DModel: 64, Heads: 4, Context: 64},
		Data:  Data{Files: []string{data.Builtin}},
		Train: Train{Steps: 200, GlobalBatch: 32, MicroBatch: 8, Seed: 1, LogEvery: 10, Metrics: "metrics.jsonl", Precision: PrecisionFP32},
		Optim: Optim{LR: 3e-3, MinLR: 3e-4, Warmup: 20, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8,
			WeightDecay: 0.1, GradClip: 1.0},
		Parallel:   Parallel{Mode: ModeHSDP},
		Checkpoint: Checkpoint{Dir: "ckpt", Every: 50, Keep: 3, MemoryEvery: 1, MemoryReplicas: 1},
	}
	c.rawFiles = c.Data.Files
	return c
}

// Params is the exact number of parameters of the model: token embedding
// (Vocab x d, tied with the output projection, so no separate output
// matrix), learned positions (context x d), per block a pre-attention
// LayerNorm (2d), fused QKV with biases (3d^2 + 3d), attention output with
// bias (d^2 + d), a pre-MLP LayerNorm (2d), the MLP d -> 4d -> d with
// biases (8d^2 + 5d), and a final LayerNorm (2d):
// (Vocab + context + 2)·d + layers·(12d^2 + 13d).
func (m Model) Params() int64 {
	d, l := int64(m.DModel), int64(m.Layers)
	return (Vocab+int64(m.Context)+2)*d + l*(12*d*d+13*d)
}

// Accumulation is the number of micro steps each rank runs per optimizer
// step: global_batch / (micro_batch x worldSize). A world size that does
// not divide is an error that lists the sizes that work.
func (c Config) Accumulation(worldSize int) (microSteps int, err error) {
	g, m := c.Train.GlobalBatch, c.Train.MicroBatch
	if g < 1 || m < 1 || g%m != 0 {
		return 0, fmt.Errorf("config: accumulation: train.global_batch = %d is not a multiple of train.micro_batch = %d", g, m)
	}
	if worldSize < 1 {
		return 0, fmt.Errorf("config: accumulation: world size %d: must be at least 1", worldSize)
	}
	per := g / m // micro batches per optimizer step, whole job
	if per%worldSize != 0 {
		return 0, fmt.Errorf("config: accumulation: train.global_batch = %d is not a multiple of train.micro_batch x world size = %d x %d; world sizes that work: %s (or change the batch sizes)",
			g, m, worldSize, joinInts(divisors(per)))
	}
	return per / worldSize, nil
}

// Layout splits worldSize workers, perNode of them on each node, into
// replicas x shards as parallel.mode says: ddp shards nothing, zero1,
// zero2, zero3 and fsdp shard over the whole world, hsdp shards over
// shard_size workers (0: perNode)
// and replicates across them. The shard size must divide the world.
func (p Parallel) Layout(worldSize, perNode int) (replicas, shards int, err error) {
	if worldSize < 1 || perNode < 1 {
		return 0, 0, fmt.Errorf("config: layout: world size %d with %d per node: both must be at least 1", worldSize, perNode)
	}
	switch p.Mode {
	case ModeDDP:
		shards = 1
	case ModeZeRO1, ModeZeRO2, ModeZeRO3, ModeFSDP:
		shards = worldSize
	case ModeHSDP:
		shards = p.ShardSize
		if shards == 0 {
			shards = min(perNode, worldSize)
		}
	default:
		return 0, 0, fmt.Errorf("config: layout: parallel.mode = %q: want %s", p.Mode, modes)
	}
	if shards < 1 || worldSize%shards != 0 {
		return 0, 0, fmt.Errorf("config: layout: shard size %d does not divide world size %d; shard sizes that work: %s",
			shards, worldSize, joinInts(divisors(worldSize)))
	}
	return worldSize / shards, shards, nil
}

// divisors lists the divisors of n >= 1 in increasing order. It takes
// sqrt(n) steps: callers pass a world size or a validated batch.
func divisors(n int) []int {
	var low, high []int
	for d := 1; d <= n/d; d++ { // d*d would overflow for n near MaxInt
		if n%d == 0 {
			low = append(low, d)
			if d*d != n {
				high = append(high, n/d)
			}
		}
	}
	for i := len(high) - 1; i >= 0; i-- {
		low = append(low, high[i])
	}
	return low
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
