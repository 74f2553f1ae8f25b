package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// CRCSocket is the name, in a snapshot directory, of the Unix socket on
// which the agent computes payload CRCs for its workers (ServeCRC); the
// agent gives its path to the workers in EnvCRC.
const CRCSocket = "crc.sock"

// EnvCRC names the agent's CRC socket for the Python package. Unset, a
// worker computes its CRCs itself (zlib.crc32).
const EnvCRC = "GORUN_SNAPSHOT_CRC"

// The CRC protocol (docs/snapshots-format.md, "The agent's CRC socket"):
// a worker sends, on one connection, requests of
//
//	u8 n, n bytes: a slot file's name in the directory (rank-<R>.slot<0|1>)
//	u64 offset, u64 length (little-endian)
//
// and reads for each, in order, a reply: u8 0 and the u32 CRC-32 (IEEE) of
// those bytes of the file, or u8 1, u16 n and n bytes of an error message.
const (
	crcReplyOK    = 0
	crcReplyError = 1
	// crcBuffer is the size of the server's reads: small enough to stay in
	// the cache between the read and the CRC (256 KiB ran at 8.9 GB/s here,
	// 1 MiB at 7.2, a mapping of the file at 1.3: its page faults).
	crcBuffer = 256 << 10
)

// CRCServer computes the CRC-32 of byte ranges of the slot files in one
// snapshot directory for the processes of the directory's user. A worker's
// save asks it for its payload's CRC instead of computing it: Go's CRC-32
// uses the CPU's carry-less multiply, about five times zlib's speed here,
// so a save costs the training that much less CPU. The worker still writes
// its header itself, after the reply: the slot keeps its one writer, and
// the crash safety of docs/snapshots-format.md is unchanged.
type CRCServer struct {
	dir string
	ln  *net.UnixListener
	wg  sync.WaitGroup

	served atomic.Uint64

	mu    sync.Mutex
	conns map[*net.UnixConn]bool
	done  bool
}

// Served is how many CRCs the server has computed and sent.
func (s *CRCServer) Served() uint64 { return s.served.Load() }

// ServeCRC listens on dir/CRCSocket (mode 0600, in a directory the caller
// made 0700) and serves until Close. It accepts a connection only from a
// process of this process's user (SO_PEERCRED). It returns an error naming
// the socket when it cannot listen.
func ServeCRC(dir string) (*CRCServer, error) {
	path := filepath.Join(dir, CRCSocket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("snapshot: the CRC socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("snapshot: the CRC socket: %w", err)
	}
	s := &CRCServer{dir: dir, ln: ln, conns: map[*net.UnixConn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Path is the socket's path, the value of EnvCRC for the workers.
func (s *CRCServer) Path() string { return filepath.Join(s.dir, CRCSocket) }

// Close stops listening, closes every connection (a request being served
// ends with it) and returns once every goroutine of the server has; it
// removes the socket file. A second Close does nothing.
func (s *CRCServer) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	err := s.ln.Close() // removes the socket file: net unlinks what it bound
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *CRCServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return // closed (Close), or the listener failed: workers compute their own CRCs
		}
		if !sameUser(c) {
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// sameUser says whether the peer of c runs as this process's user.
func sameUser(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return int(cred.Uid) == os.Getuid()
}

// serve answers c's requests in order until it closes or sends one that
// cannot be parsed.
func (s *CRCServer) serve(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, crcBuffer)
	for {
		name, off, length, err := readCRCRequest(c)
		if err != nil {
			return
		}
		crc, err := s.checksum(name, off, length, buf)
		if _, err := c.Write(crcReply(crc, err)); err != nil {
			return
		}
		if err == nil {
			s.served.Add(1)
		}
	}
}

// readCRCRequest reads one request from r.
func readCRCRequest(r io.Reader) (name string, off, length uint64, err error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", 0, 0, err
	}
	b := make([]byte, int(n[0])+16)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", 0, 0, err
	}
	le := binary.LittleEndian
	return string(b[:n[0]]), le.Uint64(b[n[0]:]), le.Uint64(b[n[0]+8:]), nil
}

// crcReply encodes the reply to a request: crc, or err's message.
func crcReply(crc uint32, err error) []byte {
	if err == nil {
		return binary.LittleEndian.AppendUint32([]byte{crcReplyOK}, crc)
	}
	msg := err.Error()
	if len(msg) > 1<<16-1 {
		msg = msg[:1<<16-1]
	}
	b := binary.LittleEndian.AppendUint16([]byte{crcReplyError}, uint16(len(msg)))
	return append(b, msg...)
}

// checksum is the CRC-32 of bytes [off, off+length) of the slot file name,
// read through buf; an error naming the file when name is not a slot's, or
// the file cannot be read or ends first.
func (s *CRCServer) checksum(name string, off, length uint64, buf []byte) (uint32, error) {
	if _, ok := slotRank(name); !ok {
		return 0, fmt.Errorf("%q is not a slot file's name (rank-<rank>.slot<0|1>)", name)
	}
	if off > 1<<62 || length > 1<<62 {
		return 0, fmt.Errorf("%s: offset %d, length %d: out of range", name, off, length)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, name), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var crc uint32
	for done := uint64(0); done < length; {
		b := buf[:min(uint64(len(buf)), length-done)]
		n, err := f.ReadAt(b, int64(off+done))
		crc = crc32.Update(crc, crc32.IEEETable, b[:n])
		done += uint64(n)
		if err != nil && done < length {
			if errors.Is(err, io.EOF) {
				return 0, fmt.Errorf("%s ends at byte %d, inside the range [%d, %d)", f.Name(), off+done, off, off+length)
			}
			return 0, err
		}
	}
	return crc, nil
}
