package snapshot

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// event encodes one inotify event as the kernel returns it, its name
// NUL-padded to a multiple of 16 bytes.
func event(mask uint32, name string) []byte {
	n := 0
	if name != "" {
		n = (len(name) + 16) / 16 * 16
	}
	b := make([]byte, unix.SizeofInotifyEvent+n)
	binary.NativeEndian.PutUint32(b[0:], 1) // wd
	binary.NativeEndian.PutUint32(b[4:], mask)
	binary.NativeEndian.PutUint32(b[12:], uint32(n))
	copy(b[unix.SizeofInotifyEvent:], name)
	return b
}

func TestAnnounced(t *testing.T) {
	names := map[string]bool{"rank-0.slot0": true, "rank-0.slot1": true}
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		events []byte
		want   bool
	}{
		{"none", nil, false},
		{"a watched slot", event(unix.IN_ATTRIB, "rank-0.slot1"), true},
		{"another rank's slot", event(unix.IN_ATTRIB, "rank-10.slot1"), false},
		{"a name that a watched one starts", event(unix.IN_ATTRIB, "rank-0.slot"), false},
		{"the watched one after others", cat(event(unix.IN_ATTRIB, "rank-1.slot0"), event(unix.IN_ATTRIB, "python"),
			event(unix.IN_ATTRIB, "rank-0.slot0")), true},
		{"events lost", event(unix.IN_Q_OVERFLOW, ""), true},
		{"a truncated event", event(unix.IN_ATTRIB, "rank-0.slot0")[:unix.SizeofInotifyEvent+4], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, announced(tc.events, names))
		})
	}
}

// TestOnlyAnnouncingRaisesAttrib checks the kernel behaviour that
// the Follower rests on: of what a writer does to a slot file (fallocate,
// pwrite, a store through a shared mapping, a truncate), nothing raises
// IN_ATTRIB but Announce. The events arrive in order, so the first
// IN_ATTRIB read after all of them and an Announce of another file must be
// that Announce's.
func TestOnlyAnnouncingRaisesAttrib(t *testing.T) {
	dir := t.TempDir()
	written, marker := filepath.Join(dir, "rank-0.slot0"), filepath.Join(dir, "rank-0.slot1")
	require.NoError(t, os.WriteFile(marker, nil, 0o600))
	f, err := os.OpenFile(written, os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer f.Close()

	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(fd)
	_, err = unix.InotifyAddWatch(fd, dir, unix.IN_ATTRIB)
	require.NoError(t, err)

	require.NoError(t, unix.Fallocate(int(f.Fd()), 0, 0, 2*HeaderSize))
	_, err = f.WriteAt([]byte("payload"), HeaderSize)
	require.NoError(t, err)
	m, err := unix.Mmap(int(f.Fd()), 0, HeaderSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	copy(m, Magic)
	require.NoError(t, unix.Msync(m, unix.MS_SYNC))
	require.NoError(t, unix.Munmap(m))
	require.NoError(t, f.Truncate(3*HeaderSize))
	require.NoError(t, Announce(marker))

	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	require.NoError(t, err, "the announcement raised no event")
	require.True(t, announced(buf[:n], map[string]bool{"rank-0.slot1": true}))
	require.False(t, announced(buf[:n], map[string]bool{"rank-0.slot0": true}), "writing a slot raised IN_ATTRIB")
}

// woken waits for a's next value; it fails the test when none comes
// within a minute (the announcement was not made or not seen).
func woken(t *testing.T, a *announcements, what string) {
	t.Helper()
	select {
	case <-a.C:
	case <-time.After(time.Minute):
		t.Fatalf("%s woke no follower", what)
	}
}

// TestAnnouncementsWake follows rank 0 of a directory: a slot that
// RankSlots.Write completes, and one that the real Python package saves,
// each wake the follower. (Which names wake it is TestAnnounced's.)
func TestAnnouncementsWake(t *testing.T) {
	defer goleak.VerifyNone(t)
	python := torch.Require(t)
	dir := t.TempDir()
	a, err := listenAnnouncements(dir, []int{0})
	require.NoError(t, err)
	defer a.Close()

	s, err := OpenRank(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	for step := uint64(1); step <= 2; step++ {
		writeStep(t, s, step)
		woken(t, a, "RankSlots.Write")
	}

	{
		cmd := exec.Command(python, "-c", `
import sys, torch, gorun
snaps = gorun.Snapshots(sys.argv[1], 0, world_size=1)
snaps.save(3, {"w": torch.ones(10)})
snaps.close()
`, dir)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "python"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "output: %s", out)
		woken(t, a, "a save of the Python package")
		step, ok := NewestHeader(dir, 0)
		require.True(t, ok)
		require.Equal(t, uint64(3), step)
	}
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "a second Close")
}
