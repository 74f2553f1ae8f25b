package config

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// design is the train.toml of gorun's first design, comments and all (examples/train.toml is the reference).
const design = `[model]
layers = 2            # transformer blocks
d_model = 64
heads = 4
context = 64          # tokens (bytes) per sequence

[data]
files = ["builtin:corpus"]   # globs ($VARS expanded; any text), or the text built into gorun

[train]
steps = 200           # optimizer steps for the whole run
global_batch = 32     # sequences per optimizer step, whole job (fixed across world sizes)
micro_batch = 8       # sequences per forward/backward on one rank
seed = 1
log_every = 10
metrics = "metrics.jsonl"   # JSON lines from rank 0: step, loss, lr, tokens_per_s, world_size

[optim]               # AdamW, linear warmup then cosine decay to min_lr
lr = 3e-3
min_lr = 3e-4
warmup = 20
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
weight_decay = 0.1
grad_clip = 1.0

[parallel]
mode = "hsdp"         # hsdp | fsdp | ddp
shard_size = 0        # 0: the number of workers per node

[checkpoint]
dir = "ckpt"          # relative paths are relative to the toml file
every = 50            # steps
keep = 3
async = false
`

func TestDesignExampleIsTheDefault(t *testing.T) {
	t.Setenv("GOROOT", "/go")
	c, err := Parse("/runs/a/train.toml", []byte(design), nil)
	require.NoError(t, err)
	d, err := Parse("/runs/a/train.toml", nil, nil)
	require.NoError(t, err)
	require.Equal(t, d, c)
	require.Equal(t, []string{"builtin:corpus"}, c.Data.Files)
	require.Equal(t, "/runs/a/ckpt", c.Checkpoint.Dir)
	require.Equal(t, "/runs/a/metrics.jsonl", c.Train.Metrics)
	require.Equal(t, 2, c.Model.Layers)
	require.InDelta(t, 3e-3, c.Optim.LR, 0)
	require.Equal(t, ModeHSDP, c.Parallel.Mode)
	require.Equal(t, PrecisionFP32, c.Train.Precision)
	require.NoError(t, c.Validate())
}

func TestLoadResolvesPathsAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "train.toml")
	doc := "[data]\nfiles = [\"text/*.txt\", \"/abs/x.txt\", \"$HOME/y.txt\"]\n[train]\nmetrics = \"m/{rank}.jsonl\"\n[checkpoint]\ndir = \"/tmp/ck\"\n"
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	t.Setenv("HOME", "/home/u")
	c, err := Load(path, nil)
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "text/*.txt"), "/abs/x.txt", "/home/u/y.txt"}, c.Data.Files)
	require.Equal(t, filepath.Join(dir, "m/{rank}.jsonl"), c.Train.Metrics)
	require.Equal(t, "/tmp/ck", c.Checkpoint.Dir)

	_, err = Load(filepath.Join(dir, "missing.toml"), nil)
	require.ErrorContains(t, err, "missing.toml")
}

func TestGOROOTDefaultsToTheBuild(t *testing.T) {
	if runtime.GOROOT() == "" { //nolint:staticcheck // what the config falls back to
		t.Skip("built with -trimpath: no GOROOT to fall back to")
	}
	t.Setenv("GOROOT", "")
	require.NoError(t, os.Unsetenv("GOROOT"))
	c, err := Parse("train.toml", []byte("[data]\nfiles = [\"$GOROOT/src/**/*.go\"]\n"), nil)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(runtime.GOROOT(), "src/**/*.go"), c.Data.Files[0]) //nolint:staticcheck
}

func TestDefaultGoRoot(t *testing.T) {
	noGo := func() (string, error) { return "", errors.New("go: not found") }
	goSays := func() (string, error) { return "/usr/lib/go", nil }
	for _, tc := range []struct {
		name, built string
		goEnv       func() (string, error)
		want        string
	}{
		{"the build's root", "/usr/local/go", goSays, "/usr/local/go"},
		{"-trimpath build: go env GOROOT", "", goSays, "/usr/lib/go"},
		{"-trimpath build, no go command", "", noGo, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, defaultGoRoot(tc.built, tc.goEnv))
		})
	}
	if _, err := exec.LookPath("go"); err == nil {
		root, err := goEnvGOROOT()
		require.NoError(t, err)
		require.DirExists(t, filepath.Join(root, "src", "fmt"))
	}
}

// data.files names the built-in corpus, or leaves it out, or is empty:
// all three are the built-in corpus with the same hash, on a machine
// without $GOROOT; an unknown built-in name is an error.
func TestBuiltinCorpus(t *testing.T) {
	t.Setenv("GOROOT", "")
	require.NoError(t, os.Unsetenv("GOROOT"))
	t.Setenv("PATH", t.TempDir()) // no go command to ask
	var hashes []string
	for _, doc := range []string{"", "[data]\nfiles = []\n", "[data]\nfiles = [\"builtin:corpus\"]\n"} {
		c, err := Parse("/r/train.toml", []byte(doc), nil)
		require.NoError(t, err, doc)
		require.Equal(t, []string{"builtin:corpus"}, c.Data.Files, doc)
		hashes = append(hashes, c.Hash())
	}
	require.Equal(t, []string{hashes[0], hashes[0], hashes[0]}, hashes)
	c, err := Parse("/r/train.toml", nil, []string{`data.files=["builtin:corpus", "extra/*.txt"]`})
	require.NoError(t, err)
	require.Equal(t, []string{"builtin:corpus", "/r/extra/*.txt"}, c.Data.Files)
	_, err = Parse("train.toml", []byte("[data]\nfiles = [\"builtin:poems\"]\n"), nil)
	require.EqualError(t, err, `train.toml:2: data.files = ["builtin:poems"]: unknown built-in corpus "builtin:poems": the one built in is "builtin:corpus"`)
}

func TestMetricsEmptyMeansNone(t *testing.T) {
	c, err := Parse("/r/train.toml", []byte("[train]\nmetrics = \"\"\n"), nil)
	require.NoError(t, err)
	require.Empty(t, c.Train.Metrics)
}

// TestMalformed is the "must show": every malformed train.toml
// gets one line naming the file, the line and the key.
func TestMalformed(t *testing.T) {
	t.Setenv("GOROOT", "/go")
	t.Setenv("GORUN_TEST_UNSET", "")
	require.NoError(t, os.Unsetenv("GORUN_TEST_UNSET"))
	cases := []struct {
		name, doc, want string
	}{
		{"negative steps", "[train]\nsteps = -5\n", "train.toml:2: train.steps = -5: must be at least 1"},
		{"zero steps", "\n\n[train]\n\nsteps = 0 # none\n", "train.toml:5: train.steps = 0: must be at least 1"},
		{"unknown key", "[train]\nsteps = 5\nstepz = 6\n", "train.toml:3: unknown key train.stepz ([train] has steps, global_batch, micro_batch, seed, log_every, metrics, precision, activation_checkpointing)"},
		{"unknown section", "[modle]\nlayers = 2\n", "train.toml:1: unknown section [modle] (the sections are model, data, train, optim, parallel, checkpoint, elastic)"},
		{"top-level key", "steps = 2\n", "train.toml:1: unknown key steps outside any section (the sections are model, data, train, optim, parallel, checkpoint, elastic)"},
		{"wrong type string", "[model]\nlayers = \"two\"\n", "train.toml:2: model.layers: want an integer, got a TOML string"},
		{"bad heartbeat", "[elastic]\nheartbeat_timeout = \"soon\"\n", `train.toml:2: elastic.heartbeat_timeout = "soon": must be a duration like "30s" ("0s" or "" for off)`},
		{"wrong type float", "[train]\nsteps = 2.5\n", "train.toml:2: train.steps: want an integer, got a TOML float"},
		{"wrong type array", "[data]\nfiles = \"a.txt\"\n", "train.toml:2: data.files: want an array of strings, got a TOML string"},
		{"negative seed", "[train]\nseed = -1\n", "train.toml:2: train.seed: negative integer value -1 cannot be stored in uint64"},
		{"syntax", "[train]\nsteps = \n", "train.toml:2: unexpected character U+000A at start of value"},
		{"duplicate key", "[train]\nsteps = 1\nsteps = 2\n", "train.toml:3: key steps is already defined"},
		{"heads do not divide", "[model]\nd_model = 64\nheads = 5\n", "train.toml:3: model.heads = 5: must divide model.d_model = 64"},
		{"d_model alone", "[model]\nd_model = 66\n", "train.toml:2: model.d_model = 66: must be a multiple of model.heads = 4"},
		{"zero heads", "[model]\nheads = 0\n", "train.toml:2: model.heads = 0: must be at least 1"},
		{"huge layers", "[model]\nlayers = 100000\n", "train.toml:2: model.layers = 100000: must be at most 1024"},
		{"zero context", "[model]\ncontext = 0\n", "train.toml:2: model.context = 0: must be at least 1"},
		{"lr zero", "[optim]\nlr = 0.0\n", "train.toml:2: optim.lr = 0: must be a finite number above 0"},
		{"lr negative", "[optim]\nlr = -1e-3\n", "train.toml:2: optim.lr = -0.001: must be a finite number above 0"},
		{"lr nan", "[optim]\nlr = nan\n", "train.toml:2: optim.lr = NaN: must be a finite number above 0"},
		{"min_lr above lr", "[optim]\nlr = 1e-3\nmin_lr = 2e-3\n", "train.toml:3: optim.min_lr = 0.002: must be at most optim.lr = 0.001"},
		{"lr below default min_lr", "[optim]\nlr = 1e-4\n", "train.toml:2: optim.lr = 0.0001: must be at least optim.min_lr = 0.0003"},
		{"warmup above steps", "[train]\nsteps = 10\n", "train.toml:2: train.steps = 10: must be at least optim.warmup = 20"},
		{"beta1 one", "[optim]\nbeta1 = 1.0\n", "train.toml:2: optim.beta1 = 1: must be between 0 and 1, both excluded"},
		{"beta2 zero", "[optim]\nbeta2 = 0\n", "train.toml:2: optim.beta2 = 0: must be between 0 and 1, both excluded"},
		{"eps zero", "[optim]\neps = 0\n", "train.toml:2: optim.eps = 0: must be a finite number above 0"},
		{"warmup negative", "[optim]\nwarmup = -1\n", "train.toml:2: optim.warmup = -1: must be at least 0"},
		{"weight decay negative", "[optim]\nweight_decay = -0.1\n", "train.toml:2: optim.weight_decay = -0.1: must be a finite number at least 0"},
		{"grad clip inf", "[optim]\ngrad_clip = inf\n", "train.toml:2: optim.grad_clip = +Inf: must be a finite number at least 0"},
		{"mode", "[parallel]\nmode = \"zero4\"\n", "train.toml:2: parallel.mode = \"zero4\": must be ddp, zero1, zero2, fsdp (or zero3) or hsdp"},
		{"precision", "[train]\nprecision = \"fp16\"\n", "train.toml:2: train.precision = \"fp16\": must be fp32 or bf16"},
		{"precision not a string", "[train]\nprecision = 16\n", "train.toml:2: train.precision: want a string, got a TOML integer"},
		{"activation_checkpointing not a bool", "[train]\nactivation_checkpointing = \"yes\"\n",
			"train.toml:2: train.activation_checkpointing: want true or false, got a TOML string"},
		{"activation_checkpointing misspelt", "[train]\nactivation_checkpoint = true\n",
			"train.toml:2: unknown key train.activation_checkpoint ([train] has steps, global_batch, micro_batch, seed, log_every, metrics, precision, activation_checkpointing)"},
		{"shard size", "[parallel]\nshard_size = -2\n", "train.toml:2: parallel.shard_size = -2: must be at least 0"},
		{"keep zero", "[checkpoint]\nkeep = 0\n", "train.toml:2: checkpoint.keep = 0: must be at least 1"},
		{"every negative", "[checkpoint]\nevery = -1\n", "train.toml:2: checkpoint.every = -1: must be at least 0"},
		{"dir empty", "[checkpoint]\ndir = \"\"\n", "train.toml:2: checkpoint.dir = \"\": must name a directory"},
		{"memory_every zero", "[checkpoint]\nmemory = true\nmemory_every = 0\n", "train.toml:3: checkpoint.memory_every = 0: must be at least 1"},
		{"memory not a bool", "[checkpoint]\nmemory = 1\n", "train.toml:2: checkpoint.memory: want true or false, got a TOML integer"},
		{"memory misspelt", "[checkpoint]\nmemroy = true\n", "train.toml:2: unknown key checkpoint.memroy ([checkpoint] has dir, every, keep, async, memory, memory_every, memory_replicas)"},
		{"batch not divisible", "[train]\nglobal_batch = 30\n", "train.toml:2: train.global_batch = 30: must be a multiple of train.micro_batch = 8"},
		{"micro not dividing", "[train]\nglobal_batch = 32\nmicro_batch = 5\n", "train.toml:2: train.global_batch = 32: must be a multiple of train.micro_batch = 5"},
		{"micro alone", "[train]\nmicro_batch = 5\n", "train.toml:2: train.micro_batch = 5: must divide train.global_batch = 32"},
		{"huge global batch", "[train]\nglobal_batch = 9223372036854775807\nmicro_batch = 1\n", "train.toml:2: train.global_batch = 9223372036854775807: must be at most 16777216"},
		{"micro zero", "[train]\nmicro_batch = 0\n", "train.toml:2: train.micro_batch = 0: must be at least 1"},
		{"log_every zero", "[train]\nlog_every = 0\n", "train.toml:2: train.log_every = 0: must be at least 1"},
		{"files empty pattern", "[data]\nfiles = [\"a\", \"\"]\n", "train.toml:2: data.files = [\"a\", \"\"]: an empty pattern matches nothing"},
		{"files unset var", "[data]\nfiles = [\"$GORUN_TEST_UNSET/*.txt\"]\n", "train.toml:2: data.files = [\"$GORUN_TEST_UNSET/*.txt\"]: $GORUN_TEST_UNSET is not set in the environment"},
		{"dotted keys", "model.heads = 3\n", "train.toml:1: model.heads = 3: must divide model.d_model = 64"},
		{"inline table", "model = { layers = 0 }\n", "train.toml:1: model.layers = 0: must be at least 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("train.toml", []byte(tc.doc), nil)
			require.Error(t, err)
			require.Equal(t, tc.want, err.Error())
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestSet(t *testing.T) {
	t.Setenv("GOROOT", "/go")
	c, err := Parse("/r/train.toml", []byte(design), []string{
		"train.steps=20", "parallel.mode=fsdp", `data.files=["a.txt", "b/*.txt"]`, "optim.lr=1e-2",
		"checkpoint.async=true", `train.metrics="out/m.jsonl"`, "train.seed = 7", `train.precision="bf16"`,
	})
	require.NoError(t, err)
	require.Equal(t, 20, c.Train.Steps)
	require.Equal(t, ModeFSDP, c.Parallel.Mode)
	require.Equal(t, []string{"/r/a.txt", "/r/b/*.txt"}, c.Data.Files)
	require.InDelta(t, 1e-2, c.Optim.LR, 0)
	require.True(t, c.Checkpoint.Async)
	require.Equal(t, "/r/out/m.jsonl", c.Train.Metrics)
	require.Equal(t, uint64(7), c.Train.Seed)
	require.Equal(t, PrecisionBF16, c.Train.Precision)

	// The last --set wins.
	c, err = Parse("/r/train.toml", nil, []string{"train.steps=20", "train.steps=30"})
	require.NoError(t, err)
	require.Equal(t, 30, c.Train.Steps)
}

func TestSetErrors(t *testing.T) {
	cases := []struct {
		name string
		sets []string
		want string
	}{
		{"unknown key", []string{"train.stepz=5"}, "--set train.stepz=5: unknown key train.stepz ([train] has steps, global_batch, micro_batch, seed, log_every, metrics, precision, activation_checkpointing)"},
		{"unknown section", []string{"trian.steps=5"}, "--set trian.steps=5: unknown key trian.steps (the sections are model, data, train, optim, parallel, checkpoint, elastic)"},
		{"no dot", []string{"steps=5"}, "--set steps=5: want section.key=value, e.g. --set train.steps=20"},
		{"no value", []string{"train.steps"}, "--set train.steps: want section.key=value, e.g. --set train.steps=20"},
		{"not an integer", []string{"train.steps=abc"}, "--set train.steps=abc: train.steps: want an integer"},
		{"string for integer", []string{`train.steps="5"`}, `--set train.steps="5": train.steps: want an integer, got a TOML string`},
		{"bad value", []string{"train.steps=-5"}, "--set train.steps=-5: must be at least 1"},
		{"bad mode", []string{"parallel.mode=zero"}, "--set parallel.mode=zero: must be ddp, zero1, zero2, fsdp (or zero3) or hsdp"},
		{"bad precision", []string{"train.precision=fp8"}, "--set train.precision=fp8: must be fp32 or bf16"},
		{"relation blames the set", []string{"model.d_model=66"}, "--set model.d_model=66: must be a multiple of model.heads = 4"},
		{"later set is blamed", []string{"model.heads=5", "model.d_model=66"}, "--set model.d_model=66: must be a multiple of model.heads = 5"},
		{"bad array", []string{"data.files=[1]"}, "--set data.files=[1]: data.files: want an array of strings, got a TOML integer"},
		{"newline", []string{"train.steps=5\n[model]\nlayers = 0"}, `--set "train.steps=5\n[model]\nlayers = 0": the value must fit on one line`},
		{"steps below warmup", []string{"train.steps=5"}, "--set train.steps=5: must be at least optim.warmup = 20"},
		{"memory_every negative", []string{"checkpoint.memory_every=-1"}, "--set checkpoint.memory_every=-1: must be at least 1"},
		{"memory not a bool", []string{"checkpoint.memory=yes"}, "--set checkpoint.memory=yes: checkpoint.memory: want true or false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("train.toml", []byte(design), tc.sets)
			require.Error(t, err)
			require.Equal(t, tc.want, err.Error())
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

// A --set relation with a value from the file points at the --set, and a
// value from the file at its line when the --set is fine.
// TestMemoryCopies: [checkpoint] memory is off by default, every step
// when on, and memory_every sets its period (file or --set).
func TestMemoryCopies(t *testing.T) {
	cases := []struct {
		name, doc string
		sets      []string
		memory    bool
		every     int
	}{
		{"default", design, nil, false, 1},
		{"on", "[checkpoint]\nmemory = true\n", nil, true, 1},
		{"on every 5", "[checkpoint]\nmemory = true\nmemory_every = 5\n", nil, true, 5},
		{"set", design, []string{"checkpoint.memory=true", "checkpoint.memory_every=3"}, true, 3},
		{"off, period kept", "[checkpoint]\nmemory_every = 2\n", nil, false, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("/r/train.toml", []byte(tc.doc), tc.sets)
			require.NoError(t, err)
			require.Equal(t, tc.memory, c.Checkpoint.Memory)
			require.Equal(t, tc.every, c.Checkpoint.MemoryEvery)
		})
	}
}

// TestActivationCheckpointing: [train] activation_checkpointing is off by
// default and turned on by the file or by --set.
func TestActivationCheckpointing(t *testing.T) {
	cases := []struct {
		name, doc string
		sets      []string
		want      bool
	}{
		{"default", design, nil, false},
		{"on", "[train]\nactivation_checkpointing = true\n", nil, true},
		{"set", design, []string{"train.activation_checkpointing=true"}, true},
		{"set off", "[train]\nactivation_checkpointing = true\n", []string{"train.activation_checkpointing=false"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("/r/train.toml", []byte(tc.doc), tc.sets)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Train.ActivationCheckpointing)
		})
	}
}

func TestBlameFileOverDefault(t *testing.T) {
	_, err := Parse("t.toml", []byte("[model]\n\nheads = 8\nd_model = 60\n"), nil)
	require.EqualError(t, err, "t.toml:3: model.heads = 8: must divide model.d_model = 60")
	_, err = Parse("t.toml", []byte("[model]\nheads = 8\n"), []string{"model.d_model=60"})
	require.EqualError(t, err, "--set model.d_model=60: must be a multiple of model.heads = 8")
}

func TestAccumulation(t *testing.T) {
	c := Default()
	cases := []struct {
		world, want int
		err         string
	}{
		{1, 4, ""}, {2, 2, ""}, {4, 1, ""},
		{3, 0, "world sizes that work: 1, 2, 4"},
		{8, 0, "is not a multiple of train.micro_batch x world size = 8 x 8; world sizes that work: 1, 2, 4"},
		{0, 0, "must be at least 1"},
	}
	for _, tc := range cases {
		got, err := c.Accumulation(tc.world)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "world %d", tc.world)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "world %d", tc.world)
	}
	c.Train.GlobalBatch, c.Train.MicroBatch = 36, 3
	_, err := c.Accumulation(5)
	require.ErrorContains(t, err, "world sizes that work: 1, 2, 3, 4, 6, 12")
}

func TestLayout(t *testing.T) {
	cases := []struct {
		mode                      string
		shardSize, world, perNode int
		replicas, shards          int
		err                       string
	}{
		{ModeHSDP, 0, 8, 4, 2, 4, ""},
		{ModeHSDP, 2, 8, 4, 4, 2, ""},
		{ModeHSDP, 0, 2, 4, 1, 2, ""},
		{ModeHSDP, 3, 8, 4, 0, 0, "shard size 3 does not divide world size 8; shard sizes that work: 1, 2, 4, 8"},
		{ModeFSDP, 0, 8, 4, 1, 8, ""},
		{ModeZeRO3, 0, 8, 4, 1, 8, ""},
		{ModeZeRO2, 0, 8, 4, 1, 8, ""},
		{ModeZeRO1, 0, 8, 4, 1, 8, ""},
		{ModeDDP, 0, 8, 4, 8, 1, ""},
		{"zero", 0, 8, 4, 0, 0, "want ddp, zero1, zero2, fsdp (or zero3) or hsdp"},
		{ModeDDP, 0, 0, 4, 0, 0, "must be at least 1"},
	}
	for _, tc := range cases {
		r, s, err := Parallel{Mode: tc.mode, ShardSize: tc.shardSize}.Layout(tc.world, tc.perNode)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, []int{tc.replicas, tc.shards}, []int{r, s}, "%+v", tc)
	}
}

func TestParams(t *testing.T) {
	// d=64, L=2, context 64: (256+64+2)*64 + 2*(12*4096 + 13*64).
	require.Equal(t, int64(322*64+2*(12*4096+13*64)), Default().Model.Params())
	require.Equal(t, int64(120_576), Default().Model.Params())
}

func TestHash(t *testing.T) {
	t.Setenv("GOROOT", "/go")
	base, err := Parse("/a/train.toml", []byte(design), nil)
	require.NoError(t, err)
	moved, err := Parse("/b/train.toml", []byte(design), nil)
	require.NoError(t, err)
	require.Equal(t, base.Hash(), moved.Hash(), "moving the run keeps the hash")
	require.Len(t, base.Hash(), 64)

	same := []string{"train.steps=400", "train.micro_batch=4", "parallel.mode=ddp", "checkpoint.keep=9", "train.log_every=1",
		"checkpoint.memory=true", "checkpoint.memory_every=5", "train.activation_checkpointing=true"}
	for _, s := range same {
		c, err := Parse("/a/train.toml", []byte(design), []string{s})
		require.NoError(t, err)
		require.Equal(t, base.Hash(), c.Hash(), s)
	}
	differ := []string{"model.layers=3", `data.files=["x.txt"]`, "train.seed=2", "train.global_batch=64", "optim.lr=1e-3", "optim.warmup=5"}
	for _, s := range differ {
		c, err := Parse("/a/train.toml", []byte(design), []string{s})
		require.NoError(t, err)
		require.NotEqual(t, base.Hash(), c.Hash(), s)
	}
	goroot := []string{`data.files=["$GOROOT/src/**/*.go"]`}
	here, err := Parse("/a/train.toml", []byte(design), goroot)
	require.NoError(t, err)
	t.Setenv("GOROOT", "/elsewhere")
	other, err := Parse("/a/train.toml", []byte(design), goroot)
	require.NoError(t, err)
	require.Equal(t, here.Hash(), other.Hash(), "the hash takes data.files as written")
}

func TestErrorsAreOneLine(t *testing.T) {
	for _, doc := range []string{"[", "[model\n", "x = = 1\n", "[train]\nsteps = 1\n[train]\n", "\"\n"} {
		_, err := Parse("f.toml", []byte(doc), nil)
		require.Error(t, err, doc)
		require.True(t, strings.HasPrefix(err.Error(), "f.toml:"), err.Error())
		require.NotContains(t, err.Error(), "\n")
	}
}

func TestExampleTrainToml(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "train.toml")
	c, err := Load(path, nil)
	require.NoError(t, err)
	abs, err := filepath.Abs(filepath.Join("..", "..", "examples", "ckpt"))
	require.NoError(t, err)
	require.Equal(t, abs, c.Checkpoint.Dir)
	for _, world := range []int{1, 2, 4} {
		_, err := c.Accumulation(world)
		require.NoError(t, err, "world %d", world)
	}
	_, err = Load(path, []string{"train.steps=20", "parallel.mode=fsdp"})
	require.NoError(t, err, "the first design's command line: --set train.steps=20 --set parallel.mode=fsdp")
}
