package pythonpkg

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Extract writes every .py file of python/gorun, byte for byte, and
// overwrites what an earlier extraction left.
func TestExtractWritesThePackage(t *testing.T) {
	src, err := filepath.Glob(filepath.Join("gorun", "*.py"))
	require.NoError(t, err)
	require.NotEmpty(t, src)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, Package), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, Package, "__init__.py"), []byte("stale"), 0o600))
	require.NoError(t, Extract(dir))
	for _, p := range src {
		want, err := os.ReadFile(p)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(dir, p))
		require.NoError(t, err, "%s not extracted", p)
		require.Equal(t, string(want), string(got), "%s differs from the source", p)
	}
	got, err := filepath.Glob(filepath.Join(dir, Package, "*"))
	require.NoError(t, err)
	require.Len(t, got, len(src), "extracted %v", got)
}

// A Python interpreter with the extraction directory on its path imports
// the package from there (not from an installed copy).
func TestExtractedPackageImports(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s", python)
	}
	dir := t.TempDir()
	require.NoError(t, Extract(dir))
	cmd := exec.Command(python, "-c", "import gorun, sys; sys.stdout.write(gorun.__file__)")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, filepath.Join(dir, Package, "__init__.py"), string(out))
}

// Extract into a place that cannot be made fails, naming it.
func TestExtractBadDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	err := Extract(file)
	require.ErrorContains(t, err, file)
}

// WarmComm is the name gorun/_warm.py gives itself while it waits.
func TestWarmCommIsTheWarmWorkersName(t *testing.T) {
	src, err := files.ReadFile(Package + "/_warm.py")
	require.NoError(t, err)
	require.Contains(t, string(src), `WARM_COMM = b"`+WarmComm+`"`)
}
