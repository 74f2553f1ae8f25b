package snapshot

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// askCRC sends one request on c and returns the CRC, or the server's
// error message.
func askCRC(t testing.TB, c net.Conn, name string, off, length uint64) (uint32, string) {
	t.Helper()
	req := append([]byte{byte(len(name))}, name...)
	req = binary.LittleEndian.AppendUint64(req, off)
	req = binary.LittleEndian.AppendUint64(req, length)
	_, err := c.Write(req)
	require.NoError(t, err)
	var status [1]byte
	_, err = io.ReadFull(c, status[:])
	require.NoError(t, err)
	if status[0] == crcReplyOK {
		var b [4]byte
		_, err = io.ReadFull(c, b[:])
		require.NoError(t, err)
		return binary.LittleEndian.Uint32(b[:]), ""
	}
	var n [2]byte
	_, err = io.ReadFull(c, n[:])
	require.NoError(t, err)
	msg := make([]byte, binary.LittleEndian.Uint16(n[:]))
	_, err = io.ReadFull(c, msg)
	require.NoError(t, err)
	return 0, string(msg)
}

// TestCRCServer: over a real Unix socket, one connection's requests get
// the CRC-32 (IEEE) of exactly the asked bytes of a slot file, also after
// the file was rewritten in place, grew, or was replaced (the server keeps
// its mapping only while it is the same file, large enough); a name that
// is not a slot's, a missing file and a range past the end are errors
// naming them, and the connection goes on serving. Close ends a
// connection still open, removes the socket and leaves no goroutine.
func TestCRCServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rank-3.slot1"), data, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes"), data, 0o600))

	s, err := ServeCRC(dir)
	require.NoError(t, err)
	fi, err := os.Stat(s.Path())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	c, err := net.Dial("unix", s.Path())
	require.NoError(t, err)
	defer c.Close()

	const all = ^uint64(0)
	for _, tc := range []struct {
		name        string
		file        string
		off, length uint64
		err         string
	}{
		{"whole file", "rank-3.slot1", 0, uint64(len(data)), ""},
		{"past the header region, across buffers", "rank-3.slot1", HeaderSize, uint64(len(data)) - HeaderSize, ""},
		{"inside one buffer", "rank-3.slot1", 7, 100, ""},
		{"empty range", "rank-3.slot1", 10, 0, ""},
		{"not a slot", "notes", 0, 10, `"notes" is not a slot file's name`},
		{"a path", "../rank-3.slot1", 0, 10, `is not a slot file's name`},
		{"missing", "rank-4.slot0", 0, 10, "no such file"},
		{"past the end", "rank-3.slot1", HeaderSize, uint64(len(data)), "ends at byte"},
		// The file as the case leaves it, whole (length: all of data then).
		{"rewritten in place", "rank-3.slot1", 0, all, ""},
		{"grown", "rank-3.slot1", 0, all, ""},
		{"replaced by a smaller file", "rank-3.slot1", 0, all, ""},
		{"shrunk below the range", "rank-3.slot1", 0, all, "ends at byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.file)
			switch tc.name {
			case "rewritten in place":
				f, err := os.OpenFile(path, os.O_WRONLY, 0)
				require.NoError(t, err)
				data[HeaderSize+5] ^= 0xff
				_, err = f.WriteAt(data[HeaderSize:HeaderSize+10], HeaderSize)
				require.NoError(t, err)
				require.NoError(t, f.Close())
			case "grown":
				data = append(data, data[:1<<20]...)
				require.NoError(t, os.WriteFile(path, data, 0o600))
			case "replaced by a smaller file":
				data = append([]byte(nil), data[:len(data)/2]...)
				data[7] ^= 0xff
				require.NoError(t, os.WriteFile(path+".new", data, 0o600))
				require.NoError(t, os.Rename(path+".new", path))
			case "shrunk below the range":
				require.NoError(t, os.Truncate(path, int64(len(data)/2)))
			}
			if tc.length == all {
				tc.length = uint64(len(data))
			}
			crc, msg := askCRC(t, c, tc.file, tc.off, tc.length)
			if tc.err != "" {
				require.Contains(t, msg, tc.err)
				return
			}
			require.Empty(t, msg)
			require.Equal(t, crc32.ChecksumIEEE(data[tc.off:tc.off+tc.length]), crc)
		})
	}

	require.NoError(t, s.Close())
	var b [1]byte
	_, err = c.Read(b[:])
	require.ErrorIs(t, err, io.EOF, "Close ends the open connection")
	_, err = os.Stat(s.Path())
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, s.Close())
}

// TestCRCOfATruncatedMapping: a slot file truncated under the server's
// mapping faults when read (SIGBUS); the server returns an error naming
// the file instead of crashing the agent.
func TestCRCOfATruncatedMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank-0.slot0")
	require.NoError(t, os.WriteFile(path, make([]byte, 1<<20), 0o600))
	maps := slotMaps{}
	defer maps.close()
	b, err := maps.get(path, 1<<20)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, 0))
	_, err = crcOfMapped(b, "rank-0.slot0")
	require.ErrorContains(t, err, "rank-0.slot0 shrank while it was read")
}

// BenchmarkCRCServer: a worker's request for the CRC of a 210 MB payload
// (the example's 100 MB model with momentum), answered over the socket
// from the agent's mapping of the slot, as after a slot's first save.
func BenchmarkCRCServer(b *testing.B) {
	dir := b.TempDir()
	const payload = 210 << 20
	data := make([]byte, HeaderSize+payload)
	for i := range data {
		data[i] = byte(i * 7)
	}
	require.NoError(b, os.WriteFile(filepath.Join(dir, "rank-0.slot0"), data, 0o600))
	s, err := ServeCRC(dir)
	require.NoError(b, err)
	defer s.Close()
	c, err := net.Dial("unix", s.Path())
	require.NoError(b, err)
	defer c.Close()
	want := crc32.ChecksumIEEE(data[HeaderSize:])
	b.SetBytes(payload)
	b.ResetTimer()
	for range b.N {
		if crc, msg := askCRC(b, c, "rank-0.slot0", HeaderSize, payload); crc != want {
			b.Fatalf("CRC %#x, want %#x (%s)", crc, want, msg)
		}
	}
}
