package estimate

import (
	"errors"
	"fmt"
	"math"

	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/model"
)

// Precision is what one parameter costs, in bytes, and how wide the
// activations are.
type Precision struct {
	Weights   float64 // bytes per parameter of the working weights
	Grads     float64 // bytes per parameter of the gradients
	Optimizer float64 // bytes per parameter of the optimizer state (K in the ZeRO paper)
	// ActivationScale multiplies the activation formula, which counts
	// 2-byte activations (1-byte dropout masks): 1 for mixed precision, 2
	// for fp32.
	ActivationScale float64
}

// MixedPrecision is the ZeRO paper's accounting for mixed-precision AdamW:
// fp16 weights and gradients (2 + 2 bytes) and K = 12 bytes of optimizer
// state (an fp32 master copy of the weights and two fp32 moments).
func MixedPrecision() Precision {
	return Precision{Weights: 2, Grads: 2, Optimizer: 12, ActivationScale: 1}
}

// FP32 is the embedded trainer's accounting: fp32 weights and gradients
// (4 + 4 bytes) and AdamW's two fp32 moments (8 bytes, no master copy:
// the weights are fp32 already); activations are fp32, twice the formula.
func FP32() Precision {
	return Precision{Weights: 4, Grads: 4, Optimizer: 8, ActivationScale: 2}
}

// Model is the shape that sets the memory of one training step.
type Model struct {
	Params float64 // parameter count
	Layers int     // transformer blocks, L
	Hidden int     // hidden size, h
	Heads  int     // attention heads, a
	Seq    int     // sequence length, s
	Batch  int     // micro batch per GPU, b
	// Vocab, when above 0, adds the fp32 logits of the loss, 4·s·b·Vocab
	// bytes, to the activations (the formula leaves the output layer out).
	Vocab int
	// ActivationBytes, when above 0, is the activation memory per GPU
	// itself, in place of the formula (FromConfig counts the embedded
	// trainer's buffers exactly).
	ActivationBytes float64
}

// Layout is the world the model trains on.
type Layout struct {
	Nodes       int // nodes
	ProcPerNode int // GPUs (processes) per node
	TP          int // tensor-parallel degree, 1 without; divides ProcPerNode
	// HSDPShard is the HSDP shard group size; 0 shards within a node
	// (ProcPerNode/TP) and replicates across nodes.
	HSDPShard int
}

// Strategy names, in the order Compute returns them.
const (
	DDP   = "ddp"
	ZeRO1 = "zero1"
	ZeRO2 = "zero2"
	ZeRO3 = "zero3/fsdp"
	HSDP  = "hsdp"
)

// Estimate is the predicted memory of one GPU under one strategy, in bytes.
type Estimate struct {
	Strategy  string `json:"strategy"`
	Shards    int    `json:"shards"`   // ways the sharded states are split
	Replicas  int    `json:"replicas"` // data-parallel copies of each shard
	Params    int64  `json:"params_bytes"`
	Grads     int64  `json:"grads_bytes"`
	Optimizer int64  `json:"optimizer_bytes"`
	// Copies are the copies of the state kept for recovery (the embedded
	// trainer's rollback copy, memory copies, async checkpoint staging);
	// 0 in the generic accounting.
	Copies      int64 `json:"copies_bytes"`
	Activations int64 `json:"activations_bytes"`
	// Comm is what the collectives keep (the embedded trainer's groups,
	// see comm.GroupUse); 0 in the generic accounting.
	Comm int64 `json:"comm_bytes,omitempty"`
	// Runtime is the process's own memory (RuntimeBytes for the embedded
	// trainer); 0 in the generic accounting.
	Runtime int64 `json:"runtime_bytes,omitempty"`
	Total   int64 `json:"total_bytes"`
}

// Validate checks that every size is positive and that the layout splits.
func (m Model) Validate() error {
	var errs []error
	if !(m.Params > 0) || math.IsInf(m.Params, 0) {
		errs = append(errs, fmt.Errorf("params %g: must be above 0", m.Params))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"seq", m.Seq}, {"batch", m.Batch}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("%s %d: must be at least 1", f.name, f.v))
		}
	}
	if m.Vocab < 0 || m.ActivationBytes < 0 || math.IsInf(m.ActivationBytes, 0) {
		errs = append(errs, fmt.Errorf("vocab %d, activation bytes %g: must be at least 0", m.Vocab, m.ActivationBytes))
	}
	return errors.Join(errs...)
}

// Validate checks that the layout splits: TP divides the processes of a
// node and the HSDP shard group divides the data-parallel world.
func (l Layout) Validate() error {
	if l.Nodes < 1 || l.ProcPerNode < 1 || l.TP < 1 {
		return fmt.Errorf("nodes %d, processes per node %d, tensor parallel %d: all must be at least 1", l.Nodes, l.ProcPerNode, l.TP)
	}
	if l.ProcPerNode%l.TP != 0 {
		return fmt.Errorf("tensor parallel %d does not divide the %d processes of a node", l.TP, l.ProcPerNode)
	}
	if s := l.hsdpShard(); s < 1 || l.dataParallel()%s != 0 {
		return fmt.Errorf("HSDP shard size %d does not divide the data-parallel world of %d", s, l.dataParallel())
	}
	return nil
}

func (l Layout) dataParallel() int { return l.Nodes * l.ProcPerNode / l.TP }

func (l Layout) hsdpShard() int {
	if l.HSDPShard > 0 {
		return l.HSDPShard
	}
	return l.ProcPerNode / l.TP
}

// Activations is the activation memory of one GPU in bytes: Korthikanti et
// al.'s s·b·h·L·(34 + 5·a·s/h) for 2-byte activations with dropout and no
// recomputation, divided by the tensor-parallel degree tp, times scale;
// plus the fp32 logits 4·s·b·Vocab/tp when Vocab is set.
func Activations(m Model, tp int, scale float64) float64 {
	s, b, h, l, a := float64(m.Seq), float64(m.Batch), float64(m.Hidden), float64(m.Layers), float64(m.Heads)
	act := s * b * h * l * (34 + 5*a*s/h) * scale
	act += 4 * s * b * float64(m.Vocab)
	return act / float64(max(tp, 1))
}

// Compute returns the per-GPU memory of m on l with precision p under each
// strategy, in the order DDP, ZeRO-1, ZeRO-2, ZeRO-3/FSDP, HSDP. With N
// data-parallel GPUs (Nodes·ProcPerNode/TP) and Ψ = Params/TP parameters
// per tensor-parallel rank: DDP keeps everything, ZeRO-1 shards the
// optimizer state over N, ZeRO-2 also the gradients, ZeRO-3/FSDP also the
// weights, HSDP shards all three over the shard group and replicates
// across groups. A sharded state is rounded up to whole parameters per
// rank, as flat buffers padded to a multiple of the shard count are. The
// figures are before framework overhead, communication buffers, the
// transiently gathered weights of ZeRO-3/FSDP and fragmentation.
func Compute(m Model, l Layout, p Precision) ([]Estimate, error) {
	if err := errors.Join(m.Validate(), l.Validate()); err != nil {
		return nil, fmt.Errorf("estimate: %w", err)
	}
	psi := m.Params / float64(l.TP)
	n, s := l.dataParallel(), l.hsdpShard()
	act := int64(math.Round(Activations(m, l.TP, p.ActivationScale)))
	if m.ActivationBytes > 0 {
		act = int64(math.Round(m.ActivationBytes))
	}
	bytes := func(perParam float64, shards int) int64 {
		return int64(math.Round(math.Ceil(psi/float64(shards)) * perParam))
	}
	row := func(name string, shards, wShards, gShards, oShards int) Estimate {
		e := Estimate{Strategy: name, Shards: shards, Replicas: n / shards,
			Params: bytes(p.Weights, wShards), Grads: bytes(p.Grads, gShards),
			Optimizer: bytes(p.Optimizer, oShards), Activations: act}
		e.Total = e.Params + e.Grads + e.Optimizer + e.Activations
		return e
	}
	return []Estimate{
		row(DDP, 1, 1, 1, 1),
		row(ZeRO1, n, 1, 1, n),
		row(ZeRO2, n, 1, n, n),
		row(ZeRO3, n, n, n, n),
		row(HSDP, s, s, s, s),
	}, nil
}

// FromConfig describes the embedded trainer of a train.toml: the exact
// parameter count of its model, a micro batch of train.micro_batch
// sequences of model.context bytes, logits over the 256 byte values, the
// trainer's activation memory counted exactly (TrainerActivations, with
// train.activation_checkpointing as set), and
// the HSDP shard group of parallel.shard_size (0: a node). It also returns
// the strategy the config runs: ddp, zero3/fsdp or hsdp.
func FromConfig(c config.Config, nodes, procPerNode int) (Model, Layout, string) {
	m := Model{
		Params: float64(c.Model.Params()), Layers: c.Model.Layers, Hidden: c.Model.DModel,
		Heads: c.Model.Heads, Seq: c.Model.Context, Batch: c.Train.MicroBatch, Vocab: config.Vocab,
		ActivationBytes: TrainerActivations(c),
	}
	l := Layout{Nodes: nodes, ProcPerNode: procPerNode, TP: 1, HSDPShard: c.Parallel.ShardSize}
	strategy := HSDP
	switch c.Parallel.Mode {
	case config.ModeDDP:
		strategy = DDP
	case config.ModeZeRO1:
		strategy = ZeRO1
	case config.ModeZeRO2:
		strategy = ZeRO2
	case config.ModeFSDP, config.ModeZeRO3:
		strategy = ZeRO3
	}
	return m, l, strategy
}

// Trainer is the memory one rank of the embedded trainer holds for c on
// nodes x procPerNode ranks, as trainer.New and its first steps allocate
// it, with N the parameter count padded to a multiple of the shard count,
// S = N/shards the slice the rank owns (S = N for ddp), and U the longest
// unit the model reads at once (model.Layout.Units: ln_2 with mlp.c_fc, a third of a block, or the
// embeddings if longer):
//   - params: the fp32 parameters, whole (4N) in ddp, zero1 and zero2;
//     in the modes that shard them at rest (zero3, fsdp, hsdp over more
//     than one shard) the rank's slice (4S) and two buffers units are
//     gathered into, the one a pass reads and the next (8U);
//   - grads: the rank's slice of the step's gradient sum in fp64 (8S),
//     rounded to fp32 in its own memory at the end of the step, but only
//     in a world of several replicas of several shards (hsdp across
//     nodes): in the others it lies in the rollback copy's memory (see
//     copies) and costs nothing here; the buffers the backward pass
//     adds a unit's gradient into before it is reduced: one for the
//     embeddings, one for ln_f, and for the blocks two they take in turn,
//     or in the modes that shard the parameters one (a third buffer of
//     the longest unit, lent in turn with the two of the parameters), 4
//     bytes per element of each; or in zero1 the whole gradient (4N)
//     instead;
//   - optimizer: AdamW's two moments (8S) (where weight decay applies is a
//     span per tensor, nothing per element);
//   - copies: the previous step's params, m and v of the slice, to roll
//     back a step that not every rank completed (12S; it holds the
//     gradient sum while the copy is not needed, see trainer's
//     rollback); with [checkpoint]
//     memory, four slice-sized copies of params, m and v across nodes (48S,
//     24S on one node: no buddy); with [checkpoint] async, the staging copy
//     of the slice a background save writes from (12S);
//   - activations: TrainerActivations;
//   - comm: the buffers of the shard group (it reduce-scatters float32
//     unit gradients into float64 slices, and gathers units) and of the
//     replica group (it all-reduces the float64 slices), as comm.GroupUse
//     counts them: a few MB, whatever the model (none for one rank);
//   - runtime: RuntimeBytes, and the garbage the collector lets grow
//     between collections at GCPercent: that share of the rest.
//
// The data set is not counted (the built-in corpus is part of
// RuntimeBytes; data.files are read whole into memory), nor the buffers of
// memory copies' own groups. It fails when c's layout does not fit the
// world.
func Trainer(c config.Config, nodes, procPerNode int) (Estimate, error) {
	if nodes < 1 || procPerNode < 1 {
		return Estimate{}, fmt.Errorf("estimate: nodes %d, processes per node %d: both must be at least 1", nodes, procPerNode)
	}
	replicas, shards, err := c.Parallel.Layout(nodes*procPerNode, procPerNode)
	if err != nil {
		return Estimate{}, fmt.Errorf("estimate: %w", err)
	}
	layout := model.NewLayout(model.Config{Layers: c.Model.Layers, DModel: c.Model.DModel, Heads: c.Model.Heads,
		Context: c.Model.Context, Vocab: config.Vocab})
	units := layout.Units()
	longest, blocks := 0, 0
	for k, u := range units {
		longest = max(longest, u.Len())
		if k > 0 && k < len(units)-1 {
			blocks = max(blocks, u.Len())
		}
	}
	unitGrads := int64(units[0].Len() + units[len(units)-1].Len() + 2*blocks)
	padded := int64(layout.PaddedSize(shards))
	slice := padded / int64(shards)
	_, _, strategy := FromConfig(c, nodes, procPerNode)
	e := Estimate{Strategy: strategy, Shards: shards, Replicas: replicas,
		Params:      4 * padded,
		Grads:       8*slice + 4*unitGrads,
		Optimizer:   8 * slice,
		Copies:      12 * slice,
		Activations: int64(math.Round(TrainerActivations(c))),
	}
	scatterOut := min(slice, int64(longest))
	if shards > 1 && config.ShardsParams(c.Parallel.Mode) {
		// Three buffers of the longest unit, taken in turn: two gathered
		// units, and one block's gradient.
		e.Params = 4*slice + 8*int64(longest)
		e.Grads = 8*slice + 4*int64(units[0].Len()+units[len(units)-1].Len()+longest)
	}
	if shards > 1 && !config.ShardsGrads(c.Parallel.Mode) {
		e.Grads = 8*slice + 4*padded
		scatterOut = slice
	}
	if replicas == 1 || shards == 1 { // the sum lies in the rollback copy
		e.Grads -= 8 * slice
	}
	if c.Checkpoint.Memory {
		e.Copies += 24 * slice
		if nodes > 1 {
			e.Copies += 24 * slice
		}
	}
	if c.Checkpoint.Async {
		e.Copies += 12 * slice
	}
	if shards > 1 { // neighbors on the node share memory (shard groups are consecutive ranks)
		e.Comm += comm.GroupUse{Members: shards, SharedMemory: procPerNode > 1,
			ScatterOut: int(scatterOut), ScatterElem: 8, Widen: true}.Bytes()
	}
	if replicas > 1 { // members are shards apart
		e.Comm += comm.GroupUse{Members: replicas, SharedMemory: shards < procPerNode}.Bytes()
	}
	e.Runtime = RuntimeBytes + (e.Params+e.Grads+e.Optimizer+e.Copies+e.Activations+e.Comm)*GCPercent/100
	e.Total = e.Params + e.Grads + e.Optimizer + e.Copies + e.Activations + e.Comm + e.Runtime
	return e, nil
}

// GCPercent is the garbage collector's pacing in a trainer worker (gorun
// worker sets it as GOGC unless the process was started with one): a
// collection once the heap has grown by that share of what the last one
// found live. A trainer's heap is nearly all long-lived buffers; at Go's
// default (100) a long run's small garbage (collectives' and records'
// allocations, under 1 MB a step) grows until it matches them. On issue
// 22's model, fsdp on 4, the peak resident memory per worker was 274 MB
// after 4 steps and 307 MB after 40, still rising; at 5, 284 MB after 40.
const GCPercent = 5

// RuntimeBytes is the resident memory of a trainer worker (gorun-worker)
// that the state, the activations and the collectives leave out: the Go
// runtime and its heap's slack, the pages of the worker binary it runs,
// the goroutine and thread stacks, and the built-in corpus. Measured with
// bench/memory.sh on a model where it is nearly all of a worker (1 layer,
// d_model 64, 2 heads, context 64: 0.1M parameters): the peak VmHWM per
// worker less what Trainer counts without it was 8.1 MB for ddp on 4
// workers, 7.9 MB for fsdp on 4 and 7.8 MB for fsdp on 8 (linux/amd64,
// go1.26, 2 CPUs). A worker that runs as `gorun worker` (no gorun-worker
// beside gorun) has about 21 MB more: the pages the init of gorun's other
// packages reads (29.3, 29.5 and 28.9 MB on the same runs).
const RuntimeBytes = 8_000_000

// TrainerActivations is the memory the embedded trainer (trainer/model)
// holds for one micro batch of train.micro_batch sequences, in bytes, as
// model.ActivationBytes counts what model.New allocates: with n =
// micro_batch·context tokens, d = d_model, a = heads, t = context, V = 256
// and L layers, per block the two LayerNorm outputs with their statistics,
// the fused q, k, v (c_attn's output, which attention reads in place), the
// attention probabilities, the attention output, the residual, and the MLP
// input, GELU derivative and GELU output (19nd + 4n + a·n·t fp32 values),
// for every block or, with train.activation_checkpointing, for one; the
// residual stream, which holds the blocks' inputs ((L+1)·nd); and once the
// final LayerNorm, the backward work buffers (c_attn's output gradient
// among them), the probabilities and logit gradients, and the partial
// column sums of 64-row chunks (10nd + 2n + 2nV + a·n·t + 4d·⌈n/64⌉ + d
// fp32 values); plus n fp64 per-row losses and 2n bytes of input and
// target tokens. Unlike the mixed-precision formula it has no dropout
// masks and keeps one t x t attention matrix per head.
// TestAgainstTheTrainer keeps it equal to what model.New allocates.
func TrainerActivations(c config.Config) float64 {
	return float64(model.ActivationBytes(modelConfig(c.Model), c.Train.MicroBatch,
		model.WithActivationCheckpointing(c.Train.ActivationCheckpointing)))
}

// modelConfig is the trainer's model.Config of [model].
func modelConfig(m config.Model) model.Config {
	return model.Config{Layers: m.Layers, DModel: m.DModel, Heads: m.Heads, Context: m.Context, Vocab: config.Vocab}
}

// Checkpointing is what activation checkpointing (train.activation_checkpointing)
// trades in the embedded trainer: activation memory for a recomputation in
// the backward pass.
type Checkpointing struct {
	On bool // train.activation_checkpointing
	// ActivationsOff and ActivationsOn are TrainerActivations with it off
	// and on, in bytes.
	ActivationsOff, ActivationsOn int64
	// TrainFLOPsPerToken are the model FLOPs of a trained token, forward and
	// backward (model.Config.TrainFLOPsPerToken; the trainer's mfu counts
	// these), and RecomputeFLOPsPerToken what checkpointing adds to them
	// (model.Config.RecomputeFLOPsPerToken).
	TrainFLOPsPerToken, RecomputeFLOPsPerToken float64
}

// TrainerCheckpointing is Checkpointing for the embedded trainer of c.
func TrainerCheckpointing(c config.Config) Checkpointing {
	off, on := c, c
	off.Train.ActivationCheckpointing, on.Train.ActivationCheckpointing = false, true
	mc := modelConfig(c.Model)
	return Checkpointing{
		On:                     c.Train.ActivationCheckpointing,
		ActivationsOff:         int64(TrainerActivations(off)),
		ActivationsOn:          int64(TrainerActivations(on)),
		TrainFLOPsPerToken:     mc.TrainFLOPsPerToken(),
		RecomputeFLOPsPerToken: mc.RecomputeFLOPsPerToken(),
	}
}

// Extra is the compute checkpointing adds, as a fraction of a step's FLOPs
// without it.
func (k Checkpointing) Extra() float64 { return k.RecomputeFLOPsPerToken / k.TrainFLOPsPerToken }

// String says, in one line, what checkpointing costs and saves, with the
// figures of the setting that runs first.
func (k Checkpointing) String() string {
	cost := fmt.Sprintf("+%.1f %% FLOPs (%s FLOP a token recomputed, over %s)", 100*k.Extra(),
		FormatCount(k.RecomputeFLOPsPerToken), FormatCount(k.TrainFLOPsPerToken))
	if k.On {
		return fmt.Sprintf("activation checkpointing on: activations %s (%s without) for %s",
			FormatBytes(k.ActivationsOn), FormatBytes(k.ActivationsOff), cost)
	}
	return fmt.Sprintf("activation checkpointing off: activations %s; with train.activation_checkpointing = true %s, for %s",
		FormatBytes(k.ActivationsOff), FormatBytes(k.ActivationsOn), cost)
}
