package durable

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/snapshot"
)

// The test binary re-executes itself as a persister: TestMain runs the role
// named by roleEnv instead of the tests. A role that waits gives up after
// roleLifetime, so a process a failed test leaves behind does not live on.
const (
	roleEnv      = "GORUN_DURABLE_TEST_ROLE"
	srcEnv       = "GORUN_DURABLE_TEST_SRC"
	dstEnv       = "GORUN_DURABLE_TEST_DST"
	pointEnv     = "GORUN_DURABLE_TEST_POINT"
	roleLifetime = 60 * time.Second
)

// runRole runs a role and returns its exit code.
func runRole(role string) int {
	if role != "persist" {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	// persist: rank 0, every 2nd step, keep 1; at the point named, say
	// "at <point>" on stdout and wait to be killed.
	stop, err := strconv.Atoi(os.Getenv(pointEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := newPersister(os.Getenv(srcEnv), []int{0}, os.Getenv(dstEnv), 2, 1, zerolog.New(os.Stderr))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p.chunk = 4096
	p.hook = func(at point, rank int, step uint64) {
		if at == point(stop) {
			fmt.Printf("at %d\n", at)
			time.Sleep(roleLifetime)
			os.Exit(3)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), roleLifetime)
	defer cancel()
	if err := p.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A persister killed (SIGKILL) at any point of a copy leaves no file under
// a final name that does not verify, and the next persister finishes the
// job and clears what the dead one left.
func TestKilledPersisterLeavesNoUnverifiedFile(t *testing.T) {
	tests := []struct {
		name   string
		at     point
		landed bool // the copy is under its final name after the kill
	}{
		{"in the middle of the payload", atCopying, false},
		{"synced, before the read-back", atSynced, false},
		{"synced and verified, before the rename", atWritten, false},
		{"renamed, before the directory's fsync", atRenamed, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := t.TempDir()
			n := newNode(t, dst, []int{0}, 1, 2, 1)
			n.save(t, 0, 1, 20*4096)
			n.save(t, 0, 2, 20*4096)

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), roleEnv+"=persist", srcEnv+"="+n.src, dstEnv+"="+dst,
				pointEnv+"="+strconv.Itoa(int(tt.at)))
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				require.NoError(t, cmd.Process.Kill())
				require.NoError(t, err, "the persister ended before the point: %v", cmd.Wait())
			}
			require.Equal(t, fmt.Sprintf("at %d\n", tt.at), line)
			require.NoError(t, cmd.Process.Kill())
			require.ErrorContains(t, cmd.Wait(), "signal: killed")

			// Every file under a final name verifies.
			finals, err := filepath.Glob(filepath.Join(dst, "step-*", "rank-*.slot"))
			require.NoError(t, err)
			for _, f := range finals {
				_, err := snapshot.Verify(f)
				require.NoError(t, err, "a file under its final name after the kill")
			}
			final := filepath.Join(dst, stepDir(2), slotName(0))
			tmps, err := filepath.Glob(filepath.Join(dst, stepDir(2), ".rank-0.slot.tmp-*"))
			require.NoError(t, err)
			if tt.landed {
				_, err := snapshot.Verify(final)
				require.NoError(t, err)
				require.Empty(t, tmps)
			} else {
				require.NoFileExists(t, final)
				require.Len(t, tmps, 1, "the dead persister's temporary copy")
			}
			hs, err := Scan(dst)
			require.NoError(t, err)
			if tt.landed {
				require.Len(t, hs, 1)
			} else {
				require.Empty(t, hs)
			}

			// The next persister copies step 2 unless it has landed, then
			// step 4; keeping 1, it clears step 2's directory.
			n.start(t, nil)
			if !tt.landed {
				n.persisted(t, 2, 0)
			}
			n.save(t, 0, 3, 20*4096)
			n.save(t, 0, 4, 20*4096)
			n.persisted(t, 4, 0)
			require.NoError(t, n.stop())
			require.Equal(t, map[string][]string{"step-000000000004": {"rank-0.slot"}}, tree(t, dst))
		})
	}
}
