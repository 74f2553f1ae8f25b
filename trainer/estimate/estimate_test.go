package estimate

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
)

// TestGPT1WorkedExample checks the worked GPT-1 example: 12 layers,
// hidden 768, 12 heads, sequence 512, ~147M parameters, micro batch 64,
// 16 optimizer bytes per parameter, one GPU. It decomposes as
//
//	weights      2 B x 147M                       =  0.294 GB
//	gradients    2 B x 147M                       =  0.294 GB
//	optimizer   16 B x 147M                       =  2.352 GB
//	activations 512·64·768·12·(34 + 5·12·512/768)
//	            = 301,989,888 x (34 + 40)         = 22.347 GB
//	total                                         = 25.287 GB ≈ 25.3 GB
//
// before framework overhead.
func TestGPT1WorkedExample(t *testing.T) {
	m := Model{Params: 147e6, Layers: 12, Hidden: 768, Heads: 12, Seq: 512, Batch: 64}
	p := MixedPrecision()
	p.Optimizer = 16
	es, err := Compute(m, Layout{Nodes: 1, ProcPerNode: 1, TP: 1}, p)
	require.NoError(t, err)
	for _, e := range es {
		require.Equal(t, int64(294e6), e.Params, e.Strategy)
		require.Equal(t, int64(294e6), e.Grads, e.Strategy)
		require.Equal(t, int64(2352e6), e.Optimizer, e.Strategy)
		require.Equal(t, int64(301_989_888*74), e.Activations, e.Strategy)
		require.InDelta(t, 25.3e9, float64(e.Total), 0.05e9, e.Strategy)
	}
}

// TestZeROPaperFigure1 checks the model states of the ZeRO paper's
// Figure 1: Ψ = 7.5B parameters, N = 64 GPUs, K = 12.
func TestZeROPaperFigure1(t *testing.T) {
	m := Model{Params: 7.5e9, Layers: 1, Hidden: 1, Heads: 1, Seq: 1, Batch: 1}
	es, err := Compute(m, Layout{Nodes: 8, ProcPerNode: 8, TP: 1}, MixedPrecision())
	require.NoError(t, err)
	want := map[string]float64{DDP: 120e9, ZeRO1: 31.4e9, ZeRO2: 16.6e9, ZeRO3: 1.9e9, HSDP: 15e9}
	for _, e := range es {
		states := float64(e.Params + e.Grads + e.Optimizer)
		require.InDelta(t, want[e.Strategy], states, 0.05e9, e.Strategy)
	}
	require.Equal(t, []int{1, 64, 64, 64, 8}, []int{es[0].Shards, es[1].Shards, es[2].Shards, es[3].Shards, es[4].Shards})
	require.Equal(t, []int{64, 1, 1, 1, 8}, []int{es[0].Replicas, es[1].Replicas, es[2].Replicas, es[3].Replicas, es[4].Replicas})
}

func TestTensorParallelAndHSDPShard(t *testing.T) {
	m := Model{Params: 8e9, Layers: 32, Hidden: 4096, Heads: 32, Seq: 2048, Batch: 1}
	base, err := Compute(m, Layout{Nodes: 2, ProcPerNode: 8, TP: 1}, MixedPrecision())
	require.NoError(t, err)
	tp, err := Compute(m, Layout{Nodes: 2, ProcPerNode: 8, TP: 4}, MixedPrecision())
	require.NoError(t, err)
	require.Equal(t, base[0].Params/4, tp[0].Params, "DDP weights split over TP")
	require.Equal(t, base[0].Activations/4, tp[0].Activations)
	// ZeRO-3 over N = 16/4 = 4 data-parallel ranks of 2e9 parameters each.
	require.Equal(t, int64(2*2e9/4), tp[3].Params)
	require.Equal(t, 2, tp[4].Shards, "HSDP shards within a node: 8 processes / TP 4")

	custom, err := Compute(m, Layout{Nodes: 2, ProcPerNode: 8, TP: 1, HSDPShard: 4}, MixedPrecision())
	require.NoError(t, err)
	require.Equal(t, 4, custom[4].Shards)
	require.Equal(t, 4, custom[4].Replicas)
}

func TestComputeRejectsBadInput(t *testing.T) {
	good := Model{Params: 1e6, Layers: 1, Hidden: 8, Heads: 1, Seq: 8, Batch: 1}
	cases := []struct {
		name string
		m    Model
		l    Layout
		want string
	}{
		{"no params", Model{Layers: 1, Hidden: 1, Heads: 1, Seq: 1, Batch: 1}, Layout{1, 1, 1, 0}, "params 0: must be above 0"},
		{"zero layers", Model{Params: 1, Hidden: 1, Heads: 1, Seq: 1, Batch: 1}, Layout{1, 1, 1, 0}, "layers 0: must be at least 1"},
		{"zero nodes", good, Layout{0, 1, 1, 0}, "all must be at least 1"},
		{"tp does not divide", good, Layout{1, 8, 3, 0}, "tensor parallel 3 does not divide the 8 processes of a node"},
		{"shard does not divide", good, Layout{2, 4, 1, 3}, "HSDP shard size 3 does not divide the data-parallel world of 8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compute(tc.m, tc.l, MixedPrecision())
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestFromConfig(t *testing.T) {
	c := config.Default()
	m, l, strategy := FromConfig(c, 1, 4)
	require.Equal(t, HSDP, strategy)
	require.InDelta(t, 120_576, m.Params, 0)
	es, err := Compute(m, l, FP32())
	require.NoError(t, err)
	ddp := es[0]
	require.Equal(t, int64(4*120_576), ddp.Params)
	require.Equal(t, int64(8*120_576), ddp.Optimizer)
	// The formula: s·b·h·L = 64·8·64·2 = 65,536 times (34 + 5·4·64/64)
	// = 54, in fp32 (x2), plus fp32 logits 4·64·8·256.
	require.InDelta(t, 65_536*54*2+4*64*8*256, Activations(m, 1, 2), 0)
	// The trainer's own count: n = 512 tokens, nd = 32,768, a·n·t = 131,072;
	// per layer 19nd + 4n + ant = 755,712 values and its input nd, once the
	// last block's output nd, and 10nd + 2n + 2nV + ant + 4d·⌈n/64⌉ + d =
	// 724,032 values, all fp32, plus 8n bytes of fp64 row losses and 2n
	// token bytes.
	require.Equal(t, int64(4*(2*(755_712+32_768)+32_768+724_032)+8*512+2*512), ddp.Activations)
	// With activation checkpointing, the activations of one block.
	c.Train.ActivationCheckpointing = true
	m, _, _ = FromConfig(c, 1, 4)
	require.InDelta(t, float64(4*(755_712+3*32_768+724_032)+8*512+2*512), m.ActivationBytes, 0)
	k := TrainerCheckpointing(c)
	require.True(t, k.On)
	require.Equal(t, ddp.Activations, k.ActivationsOff)
	require.Equal(t, int64(m.ActivationBytes), k.ActivationsOn)
	// One block recomputed (the last one's activations are still there):
	// 2·8·64² + 4·64·64 FLOPs a token, over 6·(12·2·64² + 256·64) + 12·2·64·64.
	require.InDelta(t, 16*4096+4*4096, k.RecomputeFLOPsPerToken, 0)
	require.InDelta(t, float64(16*4096+4*4096)/(6*(24*4096+256*64)+24*4096), k.Extra(), 1e-15)
	require.Contains(t, k.String(), "activation checkpointing on: activations 6.32 MB (9.34 MB without) for +10.4 % FLOPs (81920 FLOP a token recomputed, over 786432)")
	c.Train.ActivationCheckpointing = false
	require.Contains(t, TrainerCheckpointing(c).String(), "activation checkpointing off: activations 9.34 MB; with train.activation_checkpointing = true 6.32 MB, for +10.4 % FLOPs")
	hsdp := es[4]
	require.Equal(t, 4, hsdp.Shards)
	require.Equal(t, int64(4*30_144), hsdp.Params, "120,576 / 4 = 30,144 parameters per rank")

	c.Parallel.Mode = config.ModeFSDP
	_, _, strategy = FromConfig(c, 2, 2)
	require.Equal(t, ZeRO3, strategy)
	c.Parallel.Mode = config.ModeDDP
	_, _, strategy = FromConfig(c, 2, 2)
	require.Equal(t, DDP, strategy)
}

// TestTrainer: the embedded trainer's state per rank for the default
// model (120,576 parameters: embeddings of 20,480, two blocks of 49,984,
// ln_f of 128; 4 micro batches a step) by layout and recovery options, and
// what its collectives keep: a received chunk per group (512 KiB), the
// shared slots of a rank's two links on a node (1 MiB each), the scratch
// of a shard group of three or more, and a widened chunk in a shard group.
// Only hsdp across nodes (2x2) counts the fp64 gradient sum in grads: the
// other layouts keep it in the rollback copy's memory.
func TestTrainer(t *testing.T) {
	const n = 120_576
	const block, unitGrads = 49_984, 20_480 + 2*49_984 + 128 // the default model's blocks are one unit each (model.Layout.Units)
	const longest = block
	const shardedGrads = 20_480 + longest + 128
	const chunk, links = 512 << 10, 2 * 1 << 20
	tests := []struct {
		name                             string
		mode                             string
		nodes, perNode                   int
		memory, async                    bool
		shards                           int
		params, grads, opt, copies, comm int64
	}{
		{"ddp, one rank", config.ModeDDP, 1, 1, false, false, 1,
			4 * n, 4 * unitGrads, 8 * n, 12 * n, 0},
		{"fsdp over 4: slices of 30,144, two gathered units and a unit gradient", config.ModeFSDP, 2, 2, false, false, 4,
			4*30_144 + 8*longest, 4 * shardedGrads, 8 * 30_144, 12 * 30_144, chunk + links + 2*8*30_144 + chunk},
		{"fsdp over 2", config.ModeFSDP, 1, 2, false, false, 2,
			4*60_288 + 8*longest, 4 * shardedGrads, 8 * 60_288, 12 * 60_288, chunk + links + chunk},
		{"hsdp 2x2, memory copies across nodes", config.ModeHSDP, 2, 2, true, false, 2,
			4*60_288 + 8*longest, 8*60_288 + 4*shardedGrads, 8 * 60_288, 60 * 60_288, (chunk + links + chunk) + chunk},
		{"zero2 over 4: parameters whole", config.ModeZeRO2, 1, 4, false, false, 4,
			4 * n, 4 * unitGrads, 8 * 30_144, 12 * 30_144, chunk + links + 2*8*30_144 + chunk},
		{"zero1 over 4: parameters and gradients whole", config.ModeZeRO1, 1, 4, false, false, 4,
			4 * n, 4 * n, 8 * 30_144, 12 * 30_144, chunk + links + 2*8*30_144 + chunk},
		{"ddp over 4", config.ModeDDP, 1, 4, false, false, 1,
			4 * n, 4 * unitGrads, 8 * n, 12 * n, chunk + links},
		{"ddp on one node, memory copies and async saves", config.ModeDDP, 1, 2, true, true, 1,
			4 * n, 4 * unitGrads, 8 * n, (12 + 24 + 12) * n, chunk + links},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			c.Parallel.Mode = tc.mode
			c.Checkpoint.Memory, c.Checkpoint.Async = tc.memory, tc.async
			e, err := Trainer(c, tc.nodes, tc.perNode)
			require.NoError(t, err)
			require.Equal(t, tc.shards, e.Shards)
			require.Equal(t, []int64{tc.params, tc.grads, tc.opt, tc.copies, tc.comm}, []int64{e.Params, e.Grads, e.Optimizer, e.Copies, e.Comm})
			state := e.Params + e.Grads + e.Optimizer + e.Copies + e.Activations + e.Comm
			require.Equal(t, RuntimeBytes+state*GCPercent/100, e.Runtime, "the runtime and its garbage")
			require.Equal(t, e.Params+e.Grads+e.Optimizer+e.Copies+e.Activations+e.Comm+e.Runtime, e.Total)
		})
	}
	_, err := Trainer(config.Default(), 0, 1)
	require.Error(t, err)
	odd, err := Trainer(config.Default(), 1, 3) // 4 micro batches do not split over 3 ranks
	require.NoError(t, err, "estimate prints a note for such a world, and the figures")
	require.Equal(t, int64(4*shardedGrads), odd.Grads, "hsdp over 3 shards of one replica: the sum lies in the rollback copy")
}

func TestFormatBytes(t *testing.T) {
	cases := map[int64]string{0: "0 B", 999: "999 B", 1000: "1.00 kB", 482_304: "482.3 kB", 22_347_251_712: "22.3 GB", 2_352_000_000: "2.35 GB", 25_287_251_712: "25.3 GB", 120e9: "120.0 GB"}
	for n, want := range cases {
		require.Equal(t, want, FormatBytes(n), n)
	}
}

func TestWriteTableAndJSON(t *testing.T) {
	es, err := Compute(Model{Params: 147e6, Layers: 12, Hidden: 768, Heads: 12, Seq: 512, Batch: 64}, Layout{1, 8, 1, 0}, MixedPrecision())
	require.NoError(t, err)
	var b strings.Builder
	require.NoError(t, WriteTable(&b, es, HSDP))
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	require.Len(t, lines, 6)
	require.Contains(t, lines[0], "strategy")
	require.Contains(t, lines[5], "hsdp *")
	require.Regexp(t, `^\s*ddp\s+1\s+8\s+294.0 MB\s+294.0 MB\s+1.76 GB\s+22.3 GB\s+24.7 GB\s*$`, lines[1])

	require.NotContains(t, lines[0], "copies", "no row has copies")
	withCopies := slices.Clone(es)
	withCopies[4].Copies = 12e6
	b.Reset()
	require.NoError(t, WriteTable(&b, withCopies, HSDP))
	require.Regexp(t, `optimizer\s+copies\s+activations`, b.String())
	require.Regexp(t, `hsdp \*.*\s12.0 MB\s`, b.String())

	b.Reset()
	require.NoError(t, WriteJSON(&b, es, ZeRO3))
	var got []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		got = append(got, m)
	}
	require.Len(t, got, 5)
	require.Equal(t, "zero3/fsdp", got[3]["strategy"])
	require.Equal(t, true, got[3]["selected"])
	require.NotContains(t, got[0], "selected")
	for _, k := range []string{"params_bytes", "grads_bytes", "optimizer_bytes", "copies_bytes", "activations_bytes", "total_bytes", "shards", "replicas"} {
		require.Contains(t, got[0], k)
	}
	require.InDelta(t, float64(es[0].Total), got[0]["total_bytes"], 0)
}

func TestFormatCount(t *testing.T) {
	cases := map[float64]string{120_576: "120576", 147e6: "147M", 7e9: "7B", 6.7384e9: "6.738B", 1.5e12: "1.5T"}
	for n, want := range cases {
		require.Equal(t, want, FormatCount(n))
	}
}
