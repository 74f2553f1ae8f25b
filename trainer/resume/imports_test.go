package resume

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNoParentImport: package resume builds without package trainer, its parent (docs/design.md,
// "Packages and who may import whom": imports run downward); Trainer names what it needs of one instead.
func TestNoParentImport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", "github.com/gorun/gorun/trainer/resume").CombinedOutput()
	require.NoError(t, err, string(out))
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/gorun/gorun/trainer/resume")
	require.NotContains(t, deps, "github.com/gorun/gorun/trainer")
}
