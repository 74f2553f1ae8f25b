package config

import (
	"fmt"
	"math"
	"time"

	"github.com/gorun/gorun/trainer/data"
)

// Limits on the model's shape: far beyond what the embedded trainer can
// run, they keep the parameter count inside an int64. maxGlobalBatch,
// some 16 million sequences per step, keeps the tokens of a step inside
// an int64 and the world sizes an error lists (divisors) quick to find.
const (
	maxLayers      = 1 << 10
	maxDModel      = 1 << 16
	maxContext     = 1 << 20
	maxGlobalBatch = 1 << 24
)

// blame is one way to report a problem: the key to point at and what to
// say about its value.
type blame struct {
	key, msg string
}

// Validate checks every value and every relation between values. Its error
// names the key and its value but no place; Load and Parse report the
// same problems with file:line or --set.
func (c Config) Validate() error {
	if p := c.problem(); p != nil {
		return &Error{Key: p[0].key, Value: formatValue(c, p[0].key), Msg: p[0].msg}
	}
	return nil
}

// problem returns the first problem of c, as one or more blames in order
// of preference (the caller points at the key the user wrote last), or nil.
func (c Config) problem() []blame {
	atLeast := func(key string, v, lo int) []blame {
		if v < lo {
			return []blame{{key, fmt.Sprintf("must be at least %d", lo)}}
		}
		return nil
	}
	atMost := func(key string, v, hi int) []blame {
		if v > hi {
			return []blame{{key, fmt.Sprintf("must be at most %d", hi)}}
		}
		return nil
	}
	m, t, o := c.Model, c.Train, c.Optim
	checks := []func() []blame{
		func() []blame { return atLeast("model.layers", m.Layers, 1) },
		func() []blame { return atMost("model.layers", m.Layers, maxLayers) },
		func() []blame { return atLeast("model.d_model", m.DModel, 1) },
		func() []blame { return atMost("model.d_model", m.DModel, maxDModel) },
		func() []blame { return atLeast("model.heads", m.Heads, 1) },
		func() []blame {
			if m.DModel%m.Heads != 0 {
				return []blame{
					{"model.heads", fmt.Sprintf("must divide model.d_model = %d", m.DModel)},
					{"model.d_model", fmt.Sprintf("must be a multiple of model.heads = %d", m.Heads)},
				}
			}
			return nil
		},
		func() []blame { return atLeast("model.context", m.Context, 1) },
		func() []blame { return atMost("model.context", m.Context, maxContext) },
		func() []blame {
			for _, f := range c.Data.Files {
				if f == "" {
					return []blame{{"data.files", "an empty pattern matches nothing"}}
				}
				if _, ok := data.BuiltinText(f); data.IsBuiltin(f) && !ok {
					return []blame{{"data.files", fmt.Sprintf("unknown built-in corpus %q: the one built in is %q", f, data.Builtin)}}
				}
			}
			return nil
		},
		func() []blame { return atLeast("train.steps", t.Steps, 1) },
		func() []blame { return atLeast("train.global_batch", t.GlobalBatch, 1) },
		func() []blame { return atMost("train.global_batch", t.GlobalBatch, maxGlobalBatch) },
		func() []blame { return atLeast("train.micro_batch", t.MicroBatch, 1) },
		func() []blame {
			if t.GlobalBatch%t.MicroBatch != 0 {
				return []blame{
					{"train.global_batch", fmt.Sprintf("must be a multiple of train.micro_batch = %d", t.MicroBatch)},
					{"train.micro_batch", fmt.Sprintf("must divide train.global_batch = %d", t.GlobalBatch)},
				}
			}
			return nil
		},
		func() []blame { return atLeast("train.log_every", t.LogEvery, 1) },
		func() []blame {
			if t.Precision != PrecisionFP32 && t.Precision != PrecisionBF16 {
				return []blame{{"train.precision", "must be fp32 or bf16"}}
			}
			return nil
		},
		func() []blame {
			if !(o.LR > 0) || math.IsInf(o.LR, 0) {
				return []blame{{"optim.lr", "must be a finite number above 0"}}
			}
			return nil
		},
		func() []blame {
			if !(o.MinLR >= 0) || math.IsInf(o.MinLR, 0) {
				return []blame{{"optim.min_lr", "must be a finite number at least 0"}}
			}
			if o.MinLR > o.LR {
				return []blame{
					{"optim.min_lr", fmt.Sprintf("must be at most optim.lr = %g", o.LR)},
					{"optim.lr", fmt.Sprintf("must be at least optim.min_lr = %g", o.MinLR)},
				}
			}
			return nil
		},
		func() []blame { return atLeast("optim.warmup", o.Warmup, 0) },
		func() []blame {
			if o.Warmup > t.Steps {
				return []blame{
					{"optim.warmup", fmt.Sprintf("must be at most train.steps = %d", t.Steps)},
					{"train.steps", fmt.Sprintf("must be at least optim.warmup = %d", o.Warmup)},
				}
			}
			return nil
		},
		func() []blame { return openUnit("optim.beta1", o.Beta1) },
		func() []blame { return openUnit("optim.beta2", o.Beta2) },
		func() []blame {
			if !(o.Eps > 0) || math.IsInf(o.Eps, 0) {
				return []blame{{"optim.eps", "must be a finite number above 0"}}
			}
			return nil
		},
		func() []blame { return nonNegative("optim.weight_decay", o.WeightDecay) },
		func() []blame { return nonNegative("optim.grad_clip", o.GradClip) },
		func() []blame {
			switch c.Parallel.Mode {
			case ModeHSDP, ModeFSDP, ModeZeRO3, ModeZeRO2, ModeZeRO1, ModeDDP:
				return nil
			}
			return []blame{{"parallel.mode", "must be " + modes}}
		},
		func() []blame { return atLeast("parallel.shard_size", c.Parallel.ShardSize, 0) },
		func() []blame {
			if c.Checkpoint.Dir == "" {
				return []blame{{"checkpoint.dir", "must name a directory"}}
			}
			return nil
		},
		func() []blame { return atLeast("checkpoint.every", c.Checkpoint.Every, 0) },
		func() []blame { return atLeast("checkpoint.keep", c.Checkpoint.Keep, 1) },
		func() []blame { return atLeast("checkpoint.memory_every", c.Checkpoint.MemoryEvery, 1) },
		func() []blame { return atLeast("checkpoint.memory_replicas", c.Checkpoint.MemoryReplicas, 1) },
		func() []blame {
			if v := c.Elastic.HeartbeatTimeout; v != "" {
				if d, err := time.ParseDuration(v); err != nil || d < 0 {
					return []blame{{"elastic.heartbeat_timeout", `must be a duration like "30s" ("0s" or "" for off)`}}
				}
			}
			return nil
		},
	}
	for _, check := range checks {
		if p := check(); p != nil {
			return p
		}
	}
	return nil
}

func openUnit(key string, v float64) []blame {
	if !(v > 0 && v < 1) {
		return []blame{{key, "must be between 0 and 1, both excluded"}}
	}
	return nil
}

func nonNegative(key string, v float64) []blame {
	if !(v >= 0) || math.IsInf(v, 0) {
		return []blame{{key, "must be a finite number at least 0"}}
	}
	return nil
}
