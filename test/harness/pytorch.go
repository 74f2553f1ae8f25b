package harness

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// stepLine is rank 0's line after a step of examples/pytorch/snapshots.py.
var stepLine = regexp.MustCompile(`\bstep (\d+) loss `)

// LastStep is the newest step that rank 0 of examples/pytorch/snapshots.py
// said it made (`step N loss L`) in output, or -1 when it said none.
func LastStep(output string) int {
	last := -1
	for _, m := range stepLine.FindAllStringSubmatch(output, -1) {
		n, _ := strconv.Atoi(m[1])
		last = max(last, n)
	}
	return last
}

// compareModels exits non-zero unless the torch.save files argv[1] and
// argv[2] (state_dicts, or tensors) hold the same tensors, bit for bit.
const compareModels = `import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
if isinstance(a, torch.Tensor):
    a, b = {"": a}, {"": b}
assert a.keys() == b.keys(), (sorted(a), sorted(b))
for k in a:
    x, y = a[k], b[k]
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), "tensor %s differs: max |diff| %g" % (k, (x - y).abs().max())
`

// SameModel says, with python (an interpreter with PyTorch), whether the
// state_dicts (or tensors) torch.save wrote at ref and got hold the same
// tensors, bit for bit: nil when they do, else an error that names both
// files and the first tensor that differs. It gives up after a minute.
func SameModel(python, ref, got string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", compareModels, ref, got).CombinedOutput()
	if err != nil {
		return fmt.Errorf("the final model %s is not bit-identical to the fault-free run's %s: %v\n%s", got, ref, err, out)
	}
	return nil
}
