package memcopy

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"unsafe"

	"github.com/gorun/gorun/trainer/recovery"
)

// header is what a member tells the next one before its data: which step
// and elements follow, and their crc32c.
type header struct {
	step   int64
	lo, hi int64
	crc    uint32
}

const headerLen = 32

func (h header) encode() []byte {
	b := make([]byte, headerLen)
	binary.LittleEndian.PutUint64(b[0:], uint64(h.step))
	binary.LittleEndian.PutUint64(b[8:], uint64(h.lo))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.hi))
	binary.LittleEndian.PutUint32(b[24:], h.crc)
	return b
}

// decodeHeader reads a header and checks its elements are sane.
func decodeHeader(b []byte) (header, error) {
	h := header{
		step: int64(binary.LittleEndian.Uint64(b[0:])),
		lo:   int64(binary.LittleEndian.Uint64(b[8:])),
		hi:   int64(binary.LittleEndian.Uint64(b[16:])),
		crc:  binary.LittleEndian.Uint32(b[24:]),
	}
	if h.lo < 0 || h.hi < h.lo || h.hi-h.lo > maxElems {
		return h, fmt.Errorf("elements [%d, %d)", h.lo, h.hi)
	}
	return h, nil
}

// Verdicts, one byte per rank, all-gathered once the data moved.
const (
	verdictOK       byte = iota
	verdictChecksum      // the received bytes failed their crc32c
	verdictStep          // the received copy is of another step
)

// exchange sends generation i's own snapshot to the next node's rank and
// receives the previous node's into the generation, then passes on what it
// received, Replicas times in all, verifies every copy and agrees with
// every rank of the world on whether the step is complete everywhere. It
// holds no lock while data moves: Snapshot does not touch generation i
// until it ended, and Copies reads only the generations it names.
func (k *Keeper) exchange(i int) error {
	gen := &k.gens[i]
	step := gen.own.Step
	send := bytesOf(gen.ownBuf)
	sendHeader := header{step: step, lo: int64(gen.own.Lo), hi: int64(gen.own.Hi), crc: crc32.Checksum(send, k.table)}
	for len(gen.heldBufs) < k.replicas {
		gen.heldBufs = append(gen.heldBufs, nil)
	}
	held := make([]recovery.Slice, 0, k.replicas)
	verdict := verdictOK
	for hop := range k.replicas {
		got := make([]byte, headerLen)
		if err := k.g.Shift(sendHeader.encode(), got); err != nil {
			return k.fail(step, err)
		}
		theirs, err := decodeHeader(got)
		if err != nil {
			// Cannot happen between two Keepers (Snapshot validates); the ring
			// is out of step now and the World fails within its timeout.
			return k.fail(step, fmt.Errorf("rank %d sent a malformed header: %w", k.from, err))
		}
		gen.heldBufs[hop] = grow(gen.heldBufs[hop], 3*int(theirs.hi-theirs.lo))
		received := bytesOf(gen.heldBufs[hop])
		if err := k.g.Shift(send, received); err != nil {
			return k.fail(step, err)
		}
		if k.tamper != nil {
			k.tamper(received)
		}
		switch {
		case verdict != verdictOK:
		case crc32.Checksum(received, k.table) != theirs.crc:
			verdict = verdictChecksum
		case theirs.step != step:
			verdict = verdictStep
		}
		held = append(held, split(theirs.step, int(theirs.lo), int(theirs.hi), gen.heldBufs[hop]))
		// The next hop passes on what this one received, with the header
		// it came with: the next rank checks it against its sender's crc.
		send, sendHeader = received, theirs
	}
	if verdict == verdictOK {
		k.mu.Lock()
		gen.held = held
		k.pending = i
		k.mu.Unlock()
	}
	all, err := k.all.AllGatherBytes([]byte{verdict})
	if err != nil {
		return k.fail(step, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pending = -1
	if why := k.rejections(all); why != "" {
		return fmt.Errorf("memcopy: step %d: %w: %s", step, ErrRejected, why)
	}
	k.committed = i
	return nil
}

// fail marks the group failed and says which step's exchange it cut.
func (k *Keeper) fail(step int64, err error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.broken = true
	return fmt.Errorf("memcopy: exchange of step %d: %w", step, err)
}

// rejections says which ranks rejected what they received ("" when none
// did): rank r receives first from rank r - perNode, which passes on what
// it received before.
func (k *Keeper) rejections(verdicts [][]byte) string {
	var why []string
	for r, v := range verdicts {
		if len(v) == 1 && v[0] == verdictOK {
			continue
		}
		from := (r - k.perNode + len(verdicts)) % len(verdicts)
		switch {
		case len(v) != 1:
			why = append(why, fmt.Sprintf("rank %d sent a verdict of %d bytes", r, len(v)))
		case v[0] == verdictChecksum:
			why = append(why, fmt.Sprintf("the copy rank %d received from rank %d failed its crc32c check", r, from))
		case v[0] == verdictStep:
			why = append(why, fmt.Sprintf("the copy rank %d received from rank %d is of another step", r, from))
		default:
			why = append(why, fmt.Sprintf("rank %d sent verdict %d", r, v[0]))
		}
	}
	return strings.Join(why, "; ")
}

// bytesOf views f as its bytes, in the machine's order (every rank of a
// job shares it).
func bytesOf(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}
