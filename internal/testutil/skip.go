package testutil

import (
	"os"
	"testing"
)

// SkipOrFail ends t because a dependency it needs (a program, a Python
// module, root) is missing: it skips t, or fails it when CI=true, where
// scripts/test.sh has installed every dependency and a skip would hide a
// broken set-up. The message says what is missing and how to get it.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, and a dependency is missing: "+format, args...)
		return
	}
	t.Skipf(format, args...)
}
