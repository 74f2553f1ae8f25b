package testutil

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// DebianPython is Debian's python3, which python3-torch installs PyTorch for.
const DebianPython = "/usr/bin/python3"

// torchProbeTimeout bounds one import of torch (seconds on a busy machine).
const torchProbeTimeout = time.Minute

// Torch probes, once, whether Python can import torch with
// torch.distributed available. A test package keeps one Torch for all its
// tests; the zero value probes DebianPython.
type Torch struct {
	Python string // the interpreter; DebianPython when empty

	once sync.Once
	err  error
}

// Require returns the interpreter when it imports torch with
// torch.distributed available, and otherwise ends t with SkipOrFail
// (skipped, or failed when CI=true), saying why. The first call runs the
// probe (bounded by a minute); later calls reuse its answer.
func (p *Torch) Require(t testing.TB) string {
	t.Helper()
	p.once.Do(func() {
		if p.Python == "" {
			p.Python = DebianPython
		}
		p.err = probeTorch(p.Python)
	})
	if p.err != nil {
		SkipOrFail(t, "needs PyTorch (apt-get install python3-torch): %v", p.err)
	}
	return p.Python
}

// probeTorch imports torch.distributed with python and reports why it cannot.
func probeTorch(python string) error {
	ctx, cancel := context.WithTimeout(context.Background(), torchProbeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c",
		"import torch, torch.distributed as d; assert d.is_available()").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s cannot import torch.distributed: %w: %s", python, err, lastLine(string(out)))
	}
	return nil
}

// lastLine returns the last non-blank line of s, trimmed: the exception of
// a Python traceback.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
