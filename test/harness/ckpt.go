package harness

import (
	"context"
	"fmt"

	"github.com/gorun/gorun/checkpoint"
)

// NormDiff compares the newest checkpoints of ref and got by groups of tensors (the
// parameters, the AdamW first moments and the second moments, each taken as one vector):
// ||got-ref|| / ||ref|| per group name, as gorun ckpt diff --norm does. Element-wise relative
// differences are no measure across world sizes: some values are float noise around zero.
// It is an error when the checkpoints cannot be compared, or a tensor is not in both with
// the same shape. ctx bounds the reading of the checkpoints.
func NormDiff(ctx context.Context, ref, got string) (map[string]float64, error) {
	rep, err := checkpoint.CompareDirs(ctx, got, ref, checkpoint.Tolerance{Norm: true})
	if err != nil {
		return nil, err
	}
	for _, tr := range rep.Tensors {
		if !tr.Comparable() {
			return nil, fmt.Errorf("harness: %s vs %s: tensor %s is not in both with the same shape", got, ref, tr.Name)
		}
	}
	out := map[string]float64{}
	for _, g := range rep.Groups {
		out[g.Name] = g.NormRel()
	}
	return out, nil
}

// NewestStep is the step of the newest complete checkpoint in dir; it is an error when dir
// holds none (the error lists what it holds).
func NewestStep(dir string) (int64, error) {
	entries, err := checkpoint.List(dir)
	if err != nil {
		return 0, err
	}
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].Complete {
			return entries[i].Step, nil
		}
	}
	return 0, fmt.Errorf("harness: no complete checkpoint in %s: %v", dir, entries)
}
