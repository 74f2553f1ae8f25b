package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"

	"github.com/gorun/gorun/internal/snapshot"
)

// After the handshake, a push connection carries any number of pushes:
//
//	pusher -> server  push request: round, rank, the slot's 64 header bytes
//	server -> pusher  verdict (a refusal ends the push here)
//	pusher -> server  the payload (header's length bytes), then one trailer byte
//	server -> pusher  verdict: the copy was written complete, or why not
//
// and a fetch connection one fetch:
//
//	fetcher -> server  fetch request: rank, step
//	server -> fetcher  verdict, then the slot's 64 header bytes, the payload
//	                   and one trailer byte
//
// The trailer says whether the sender still found the slot's header as it
// was when it began (commit) or found the slot being overwritten (drop):
// the receiver writes a slot's header only after a commit and a payload
// whose CRC-32 is the header's.
const (
	pushRequestLen  = 8 + 4 + headerLen
	fetchRequestLen = 4 + 8
	headerLen       = snapshot.HeaderLen

	trailerDrop   byte = 0
	trailerCommit byte = 1
)

// status is the first byte of a verdict.
type status byte

const (
	statusOK         status = iota
	statusBadRequest        // a message the server could not parse
	statusOtherRun          // handshake: another run id
	statusAuth              // handshake: the dialer's proof is wrong
	statusRefused           // push: not of the round the server accepts, or of its own rank, or busy
	statusNotFound          // fetch: no complete slot of that rank and step
	statusFailed            // the copy was not written (cut short, dropped, corrupt, I/O)
	statusBusy              // push: a copy of the rank is still being written (try again)
)

var (
	// ErrRefused says that a server turned a push away: it accepts another
	// round, none (between rounds), or the rank is one of its own.
	ErrRefused = errors.New("replica: push refused")
	// ErrNotFound says that a server holds no complete snapshot of the
	// rank at the step asked for.
	ErrNotFound = errors.New("replica: no such snapshot")
	// errDropped is a copy the sender dropped: the slot changed under it.
	errDropped = errors.New("the sender dropped this copy: the worker overwrote the slot while it was read")
)

// writeVerdict sends a status and a reason (cut to 255 bytes).
func writeVerdict(w io.Writer, st status, reason string) error {
	if len(reason) > 255 {
		reason = reason[:255]
	}
	b := make([]byte, 0, 2+len(reason))
	b = append(b, byte(st), byte(len(reason)))
	_, err := w.Write(append(b, reason...))
	return err
}

// readVerdict reads a verdict: nil for statusOK, else a *verdictError of
// what (the exchange it ends), or the read's error.
func readVerdict(r io.Reader, what string) error {
	var head [2]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	reason := make([]byte, head[1])
	if _, err := io.ReadFull(r, reason); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if status(head[0]) == statusOK {
		return nil
	}
	return &verdictError{what: what, status: status(head[0]), reason: string(reason)}
}

// verdictError is the other end's answer other than OK: it wraps ErrAuth,
// ErrRefused or ErrNotFound where the status says so.
type verdictError struct {
	what   string
	status status
	reason string // the other end's, as it sent it
}

func (e *verdictError) Error() string {
	switch e.status {
	case statusAuth:
		return fmt.Sprintf("%s: refused: %v", e.what, ErrAuth)
	case statusOtherRun:
		return fmt.Sprintf("%s: refused: the other end is an agent of another run (its run id differs)", e.what)
	case statusRefused:
		return fmt.Sprintf("%s: %v: %s", e.what, ErrRefused, e.reason)
	case statusNotFound:
		return fmt.Sprintf("%s: %v: %s", e.what, ErrNotFound, e.reason)
	case statusBadRequest:
		return fmt.Sprintf("%s: the other end could not parse it: %s", e.what, e.reason)
	case statusFailed:
		return fmt.Sprintf("%s: the copy was not written: %s", e.what, e.reason)
	case statusBusy:
		return fmt.Sprintf("%s: not now: %s", e.what, e.reason)
	}
	return fmt.Sprintf("%s: status %d (not a gorun snapshot replica server?): %s", e.what, e.status, e.reason)
}

func (e *verdictError) Unwrap() error {
	switch e.status {
	case statusAuth:
		return ErrAuth
	case statusRefused:
		return ErrRefused
	case statusNotFound:
		return ErrNotFound
	}
	return nil
}

// pushRequest opens one push.
type pushRequest struct {
	round  int
	rank   int
	header [headerLen]byte
}

func (p pushRequest) encode() [pushRequestLen]byte {
	var b [pushRequestLen]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(int64(p.round)))
	binary.LittleEndian.PutUint32(b[8:], uint32(int32(p.rank)))
	copy(b[12:], p.header[:])
	return b
}

// decodePushRequest parses b and its header; errors say what is wrong.
func decodePushRequest(b [pushRequestLen]byte) (pushRequest, snapshot.Header, error) {
	p := pushRequest{
		round: int(int64(binary.LittleEndian.Uint64(b[0:]))),
		rank:  int(int32(binary.LittleEndian.Uint32(b[8:]))),
	}
	copy(p.header[:], b[12:])
	if p.rank < 0 {
		return p, snapshot.Header{}, fmt.Errorf("push of rank %d: ranks are >= 0", p.rank)
	}
	h, err := snapshot.ParseHeader(p.header[:])
	if err != nil {
		return p, h, fmt.Errorf("push of rank %d: header: %w", p.rank, err)
	}
	return p, h, checkLength(h)
}

// checkLength refuses an empty payload: every snapshot has one, and a
// payloadReader must see its trailer.
func checkLength(h snapshot.Header) error {
	if h.Length == 0 {
		return fmt.Errorf("step %d: an empty payload (no snapshot has one)", h.Step)
	}
	return nil
}

// fetchRequest asks for rank's snapshot at step.
type fetchRequest struct {
	rank int
	step uint64
}

func (f fetchRequest) encode() [fetchRequestLen]byte {
	var b [fetchRequestLen]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(int32(f.rank)))
	binary.LittleEndian.PutUint64(b[4:], f.step)
	return b
}

func decodeFetchRequest(b [fetchRequestLen]byte) fetchRequest {
	return fetchRequest{rank: int(int32(binary.LittleEndian.Uint32(b[0:]))), step: binary.LittleEndian.Uint64(b[4:])}
}

// readHeader reads the 64 header bytes of the slot file f (whatever they
// hold: parse them to know).
func readHeader(f *os.File) ([headerLen]byte, error) {
	var b [headerLen]byte
	_, err := f.ReadAt(b[:], 0)
	return b, err
}

// sendPayload streams the payload of slot file f, whose header read raw
// and parsed h, to c (the kernel copies it: sendfile), then the trailer:
// commit when f's header still reads raw, drop otherwise. It returns
// errDropped for a dropped copy (c stays usable), another error when c can
// no longer be used.
func sendPayload(c net.Conn, f *os.File, raw [headerLen]byte, h snapshot.Header) error {
	if _, err := f.Seek(snapshot.HeaderSize, io.SeekStart); err != nil {
		return err
	}
	n, err := io.Copy(c, &io.LimitedReader{R: f, N: int64(h.Length)})
	if err != nil {
		return err
	}
	if uint64(n) != h.Length {
		return fmt.Errorf("%s: %d payload bytes, the header says %d (the file shrank)", f.Name(), n, h.Length)
	}
	now, err := readHeader(f)
	trailer := trailerCommit
	if err != nil || now != raw {
		trailer = trailerDrop
	}
	if _, err := c.Write([]byte{trailer}); err != nil {
		return err
	}
	if trailer == trailerDrop {
		return errDropped
	}
	return nil
}

// payloadReader reads one payload and its trailer from r for
// snapshot.RankSlots.Write. It holds back the payload's last bytes until
// the trailer says commit, and fails instead, so that Write never writes
// the header of a copy that was dropped or cut short. Write checks the
// payload against a non-zero header CRC; payloadReader checks it where
// the CRC is zero (which Write takes as "none given").
type payloadReader struct {
	r     io.Reader
	left  uint64
	crc   uint32
	want  uint32
	check bool // the CRC is zero: Write does not check it
	// got, when set, is told the payload bytes read so far (a test hook).
	got  func(n uint64)
	read uint64
}

func newPayloadReader(r io.Reader, h snapshot.Header, got func(uint64)) *payloadReader {
	return &payloadReader{r: r, left: h.Length, want: h.CRC, check: h.CRC == 0, got: got}
}

func (p *payloadReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if uint64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, err := p.r.Read(b)
	if p.check {
		p.crc = crc32.Update(p.crc, crc32.IEEETable, b[:n])
	}
	p.left -= uint64(n)
	p.read += uint64(n)
	if p.got != nil && n > 0 {
		p.got(p.read)
	}
	if p.left > 0 {
		if err == io.EOF {
			err = fmt.Errorf("the sender went away %d bytes short of the payload: %w", p.left, io.ErrUnexpectedEOF)
		}
		return n, err
	}
	var trailer [1]byte
	if _, err := io.ReadFull(p.r, trailer[:]); err != nil {
		return 0, fmt.Errorf("the sender went away before its trailer: %w", err)
	}
	switch {
	case trailer[0] != trailerCommit:
		return 0, errDropped
	case p.check && p.crc != p.want:
		return 0, fmt.Errorf("payload CRC-32 %#08x, the header says %#08x", p.crc, p.want)
	}
	return n, nil
}
