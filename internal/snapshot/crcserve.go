package snapshot

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
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
)

// CRCServer computes the CRC-32 of byte ranges of the slot files in one
// snapshot directory for the processes of the directory's user. A worker's
// save asks it for its payload's CRC instead of computing it: Go's CRC-32
// uses the CPU's carry-less multiply, ten times zlib's speed here,
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
	maps := slotMaps{}
	defer func() {
		maps.close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	for {
		name, off, length, err := readCRCRequest(c)
		if err != nil {
			return
		}
		crc, err := s.checksum(maps, name, off, length)
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

// checksum is the CRC-32 of bytes [off, off+length) of the slot file
// name, read through its mapping in maps; an error naming the file when
// name is not a slot's, or the file cannot be mapped or ends first.
func (s *CRCServer) checksum(maps slotMaps, name string, off, length uint64) (uint32, error) {
	if _, ok := slotRank(name); !ok {
		return 0, fmt.Errorf("%q is not a slot file's name (rank-<rank>.slot<0|1>)", name)
	}
	if off > 1<<62 || length > 1<<62 {
		return 0, fmt.Errorf("%s: offset %d, length %d: out of range", name, off, length)
	}
	data, err := maps.get(filepath.Join(s.dir, name), off+length)
	if err != nil {
		return 0, err
	}
	return crcOfMapped(data[off:off+length], name)
}

// crcOfMapped is the CRC-32 of b, mapped from file name; a file truncated
// under the mapping faults (SIGBUS), which is an error here, not a crash.
func crcOfMapped(b []byte, name string) (crc uint32, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s shrank while it was read: %v", name, r)
		}
	}()
	return crc32.ChecksumIEEE(b), nil
}

// slotMaps are one connection's slot files, each mapped read-only and
// shared, kept from one request to the next: a tmpfs file's pages stay
// mapped, so after the first CRC of a slot the next ones read its memory at
// the CRC's own speed (26 GB/s here), where reading it through a buffer ran
// at 8.9 GB/s (a copy) and a fresh mapping at 1.3-2 (its page faults). A
// file is mapped anew when it is another file (its inode) or has grown.
type slotMaps map[string]mappedSlot

type mappedSlot struct {
	ino  uint64
	data []byte
}

// get returns path's mapping, which holds at least end bytes; an error
// naming path when it is not a regular file, ends before end, or cannot be
// mapped.
func (m slotMaps) get(path string, end uint64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s is not a regular file", path)
	case uint64(st.Size) < end:
		return nil, fmt.Errorf("%s ends at byte %d, before byte %d", path, st.Size, end)
	}
	if old, ok := m[path]; ok {
		if old.ino == st.Ino && uint64(len(old.data)) >= end {
			return old.data, nil
		}
		_ = unix.Munmap(old.data)
		delete(m, path)
	}
	if end == 0 {
		return nil, nil
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	m[path] = mappedSlot{ino: st.Ino, data: data}
	return data, nil
}

// close unmaps every slot.
func (m slotMaps) close() {
	for path, s := range m {
		_ = unix.Munmap(s.data)
		delete(m, path)
	}
}
