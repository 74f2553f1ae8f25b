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
func askCRC(t *testing.T, c net.Conn, name string, off, length uint64) (uint32, string) {
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
// the CRC-32 (IEEE) of exactly the asked bytes of a slot file, across the
// server's read buffer; a name that is not a slot's, a missing file and a
// range past the end are errors naming them, and the connection goes on
// serving. Close ends a connection still open, removes the socket and
// leaves no goroutine.
func TestCRCServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	data := make([]byte, 3*crcBuffer+12345)
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
	} {
		t.Run(tc.name, func(t *testing.T) {
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
