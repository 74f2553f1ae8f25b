package comm

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// unixPair returns the two ends of a connected Unix stream socket.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// memfd makes a memfd of size bytes, with seals when seals is not 0.
func memfd(t *testing.T, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, size))
	if seals != 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		require.NoError(t, err)
	}
	return fd
}

// A peer's region is mapped only when it cannot shrink under us: an
// unsealed memfd (which the peer could cut to 0 bytes and so SIGBUS this
// process), a small one or another kind of file is a clean error.
func TestShmReceiverChecksRegion(t *testing.T) {
	tmp, err := os.CreateTemp(t.TempDir(), "file")
	require.NoError(t, err)
	defer tmp.Close()
	require.NoError(t, tmp.Truncate(shmSize))
	tests := []struct {
		name string
		fd   func() int
		want string
	}{
		{"unsealed, then shrunk", func() int {
			fd := memfd(t, shmSize, 0)
			require.NoError(t, unix.Ftruncate(fd, 0))
			return fd
		}, "not sealed against shrinking"},
		{"unsealed", func() int { return memfd(t, shmSize, 0) }, "not sealed against shrinking"},
		{"sealed but small", func() int { return memfd(t, 4096, shmSeals) }, "has 4096 bytes"},
		{"a plain file", func() int { return int(tmp.Fd()) }, "not a sealable memfd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tx, rx := unixPair(t)
			_, _, err := tx.WriteMsgUnix([]byte{'S'}, unix.UnixRights(tc.fd()), nil)
			require.NoError(t, err)
			ring, err := newShmReceiver(rx, 5*time.Second)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, ring)
		})
	}
}

// Our own regions are sealed: nobody can shrink them, and a receiver
// maps them.
func TestShmSenderSeals(t *testing.T) {
	mem, fd := makeShm()
	require.NotNil(t, mem)
	defer unix.Munmap(mem)
	defer unix.Close(fd)
	require.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM)
	require.NoError(t, checkShm(fd))

	tx, rx := unixPair(t)
	sent, err := newShmSender(tx, 5*time.Second)
	require.NoError(t, err)
	defer sent.close()
	got, err := newShmReceiver(rx, 5*time.Second)
	require.NoError(t, err)
	defer got.close()
	sent.slot(0)[7] = 42
	require.Equal(t, byte(42), got.slot(0)[7])
}

// Unix connections between ranks check the other end's user; the same
// user passes.
func TestSameUserPasses(t *testing.T) {
	a, b := unixPair(t)
	require.NoError(t, checkSameUser(a))
	require.NoError(t, checkSameUser(b))
}
