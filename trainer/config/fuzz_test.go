package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzParse feeds train.toml documents and --set overrides to Parse: any
// input gives a valid Config or one *Error on one line, never a panic,
// and a Config that Parse accepts is one its users can take as it is.
func FuzzParse(f *testing.F) {
	f.Setenv("GOROOT", "/go")
	example, err := os.ReadFile("../../examples/train.toml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct{ doc, set string }{
		{design, ""},
		{string(example), "train.steps=300"},
		{"", "parallel.mode=fsdp"},
		{"[train]\nsteps = -5\n", ""},
		{"model = { layers = 0 }\n", ""},
		{"model.heads = 3\n", "model.d_model=66"},
		{"[data]\nfiles = [\"$GORUN_FUZZ_UNSET/*.txt\", \"${GOROOT}/src/**/*.go\"]\n", ""},
		{"[elastic]\nheartbeat_timeout = \"30s\"\n", "elastic.heartbeat_timeout=soon"},
		{"[checkpoint]\nmemory = true\nmemory_every = 0\n", "checkpoint.memory_every=2"},
		{"[[model]]\nlayers = 1\n", "data.files=[1]"},
		{"[optim]\nlr = nan\n", "optim.lr=inf"},
		{"[train]\nseed = 18446744073709551615\n", "train.seed=-1"},
		{"[model]\nlayers = 1024\nd_model = 9223372036854775807\nheads = 1\n", "model.context=9223372036854775807"},
		{"[parallel]\nshard_size = 9223372036854775807\n", "train.global_batch=9223372036854775807"},
		{"[train]\n\"st\\neps\" = 1\n", "0\n.0="}, // found: a line break in a key broke the error's line
		// Found by this fuzzer: Accumulation listed the divisors of 2^63-1
		// micro batches, some 3e9 steps (and d*d overflowed).
		{"[train]\nglobal_batch = 9223372036854775807\nmicro_batch = 1\n", ""},
		{"a = \"\"\"\n\"\"\"\n", "train.steps=5\n[model]"},
	} {
		f.Add([]byte(seed.doc), seed.set)
	}
	f.Fuzz(func(t *testing.T, doc []byte, set string) {
		var sets []string
		if set != "" {
			sets = strings.Split(set, ";")
		}
		c, err := Parse("/fuzz/train.toml", doc, sets)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is no *Error: %v", err, err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("error on more than one line: %q", err.Error())
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v", err)
		}
		_ = c.Hash()
		_ = c.Model.Params()
		_ = c.Elastic.Heartbeat()
		for _, world := range []int{1, 2, 3, 8, 1 << 20} {
			_, _ = c.Accumulation(world)
			_, _, _ = c.Parallel.Layout(world, 4)
		}
	})
}
