package comm

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// shmSlots is how many chunks one same-node link holds in flight: two,
// so the sender fills one while the receiver reads the other. The slots
// are shared pages resident in both processes; four held 2 MiB more per
// rank and moved no more (gorun bench comm, 2 and 8 ranks, 1-16 MiB).
const shmSlots = 2

// shmRing is a ring of chunk-sized slots in memory shared by the two
// ends of one same-node data link. The sender copies a chunk into the next
// slot and writes one byte on the link; the receiver reads that byte, uses
// the slot in place (adding straight from it) and writes one byte back, a
// credit, once the slot is free. The socket still carries every wake-up,
// so deadlines, a dead peer's EOF and the headers work as on TCP; the
// data crosses memory once instead of twice.
type shmRing struct {
	mem  []byte
	seq  uint64 // next slot this end uses
	free int    // sender only: slots it may fill before it needs a credit
}

func (r *shmRing) slot(seq uint64) []byte {
	k := int(seq % shmSlots)
	return r.mem[k*chunkBytes : (k+1)*chunkBytes]
}

func (r *shmRing) close() error {
	if r == nil || r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	return err
}

// newShmSender creates the shared slots and passes them to the receiver
// over c; when they cannot be made, it tells the receiver so and returns
// nil: the link then carries its data itself.
func newShmSender(c *net.UnixConn, timeout time.Duration) (*shmRing, error) {
	mem, fd := makeShm()
	msg, oob := []byte{'N'}, []byte(nil)
	if mem != nil {
		defer unix.Close(fd)
		msg, oob = []byte{'S'}, unix.UnixRights(fd)
	}
	if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if _, _, err := c.WriteMsgUnix(msg, oob, nil); err != nil {
		if mem != nil {
			unix.Munmap(mem)
		}
		return nil, fmt.Errorf("pass shared memory: %w", err)
	}
	if mem == nil {
		return nil, nil
	}
	return &shmRing{mem: mem, free: shmSlots}, nil
}

// shmSize is the size of one link's shared slots.
const shmSize = shmSlots * chunkBytes

// shmSeals are the seals a sender puts on its memfd and a receiver
// requires before it maps one: the size can then never change, so a
// peer cannot shrink the file under our mapping (a SIGBUS on the next
// access), and no seal can be added or removed any more.
const shmSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// makeShm returns the mapped slots and their descriptor, sealed, or nil.
func makeShm() ([]byte, int) {
	fd, err := unix.MemfdCreate("gorun-comm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1
	}
	if err := unix.Ftruncate(fd, shmSize); err != nil {
		unix.Close(fd)
		return nil, -1
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals); err != nil {
		unix.Close(fd)
		return nil, -1
	}
	mem, err := unix.Mmap(fd, 0, shmSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1
	}
	return mem, fd
}

// newShmReceiver maps the slots its sender passes over c, or returns nil
// when the sender has none. It maps only a memfd sealed against resizing
// (checkShm): anything else is an error, never a later SIGBUS.
func newShmReceiver(c *net.UnixConn, timeout time.Duration) (*shmRing, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	b, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, fmt.Errorf("receive shared memory: %w", err)
	}
	if n == 1 && b[0] == 'N' && oobn == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || n != 1 || b[0] != 'S' || len(msgs) != 1 {
		return nil, errors.New("receive shared memory: no descriptor")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) == 0 {
		return nil, errors.New("receive shared memory: no descriptor")
	}
	for _, fd := range fds {
		defer unix.Close(fd)
	}
	if len(fds) != 1 {
		return nil, fmt.Errorf("receive shared memory: %d descriptors, want 1", len(fds))
	}
	if err := checkShm(fds[0]); err != nil {
		return nil, fmt.Errorf("receive shared memory: %w", err)
	}
	mem, err := unix.Mmap(fds[0], 0, shmSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &shmRing{mem: mem}, nil
}

// checkShm says why fd is not a region this end may map: it must be a
// memfd sealed against shrinking (so its size stays what fstat says) of
// at least shmSize bytes.
func checkShm(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a sealable memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return errors.New("the memfd is not sealed against shrinking (it could be cut under the mapping)")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Size < shmSize {
		return fmt.Errorf("the memfd has %d bytes, want %d", st.Size, shmSize)
	}
	return nil
}
