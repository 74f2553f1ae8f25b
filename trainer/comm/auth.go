package comm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/jobsecret"
)

// ErrAuthFailed says that the other end of a connection does not hold
// this worker's job secret (or is no gorun worker of this job at all).
var ErrAuthFailed = errors.New("authentication failed: wrong GORUN_JOB_SECRET?")

// Every connection, to the bootstrap store and between ranks, starts with
// a mutual challenge-response on the job secret, in fixed-size messages,
// before anything else is read or allocated:
//
//	dialer   -> listener  clientHello: magic, round, dialer's rank, nonce D
//	listener -> dialer    serverHello: status, nonce L, proof L = HMAC(key, "listener" ...)
//	dialer   -> listener  proof D = HMAC(key, "dialer" ...)
//	listener -> dialer    verdict
//
// Both proofs cover the round (run id and restart count), both ranks, the
// listener's role (store or peer) and both nonces, which are fresh random
// bytes: a proof seen once is no use on any other connection. A listener
// that refuses says only "wrong round", "not a peer" or "refused".
const (
	nonceLen = 32
	macLen   = sha256.Size

	helloLen   = len(authMagic) + sha256.Size + 4 + nonceLen // clientHello
	replyLen   = 1 + nonceLen + macLen                       // serverHello
	authPrefix = "gorun comm auth v1"
)

var authMagic = [8]byte{'g', 'o', 'r', 'u', 'n', 'c', 'o', '1'}

// Roles of a listener: the proofs of a store handshake cannot stand for a
// peer handshake's.
const (
	roleStore byte = 's'
	rolePeer  byte = 'p'
)

// Status bytes of serverHello and of the verdict.
const (
	statusOK byte = iota
	statusOtherRound
	statusNotPeer
	statusRefused
)

// maxPendingAuth caps the connections of one listener in their handshake
// at once; more wait in the kernel's accept queue.
const maxPendingAuth = 32

// maxAuthTimeout bounds a listener's wait for a dialer's handshake, so a
// connection that says nothing frees its slot soon.
const maxAuthTimeout = 10 * time.Second

// auth holds what both ends of a handshake must share.
type auth struct {
	key   []byte
	round [sha256.Size]byte
}

func newAuth(secret jobsecret.Secret, token string) auth {
	return auth{key: secret.Key("comm"), round: sha256.Sum256([]byte(authPrefix + " round: " + token))}
}

// proof is the HMAC one side sends: side names who sends it.
func (a auth) proof(side string, role byte, from, to int32, dn, ln []byte) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(authPrefix + " " + side))
	m.Write([]byte{role})
	m.Write(a.round[:])
	var ranks [8]byte
	binary.BigEndian.PutUint32(ranks[:4], uint32(from))
	binary.BigEndian.PutUint32(ranks[4:], uint32(to))
	m.Write(ranks[:])
	m.Write(dn)
	m.Write(ln)
	return m.Sum(nil)
}

// authRefusal is why a listener refused a dialer: logged on the
// listener's side, never sent. The dialer is told only status (none when
// it is statusOK: it did not even send a handshake).
type authRefusal struct {
	from   int
	why    string
	status byte
}

// tell sends the dialer its status, if any; the caller then closes c.
// It is sent after the refusal was logged, so a refused dialer's error
// never comes before the listener's line about it.
func (e *authRefusal) tell(c net.Conn) {
	if e.status != statusOK {
		_, _ = c.Write([]byte{e.status})
	}
}

func (e *authRefusal) Error() string {
	if e.from < 0 {
		return e.why
	}
	return fmt.Sprintf("%s (it claimed rank %d)", e.why, e.from)
}

// accept runs the listener's side on c: role is what this listener is,
// self its rank, isPeer says which dialer ranks it admits. It returns the
// dialer's rank, proven, or an *authRefusal (to log, tell and close c)
// or an I/O error.
func (a auth) accept(c net.Conn, role byte, self int, isPeer func(int) bool, timeout time.Duration) (int, error) {
	if err := c.SetDeadline(time.Now().Add(min(timeout, maxAuthTimeout))); err != nil {
		return -1, err
	}
	var hello [helloLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return -1, &authRefusal{from: -1, why: fmt.Sprintf("no handshake (%v)", err)}
	}
	magic, round := hello[:len(authMagic)], hello[len(authMagic):len(authMagic)+sha256.Size]
	fromBytes, dn := hello[len(authMagic)+sha256.Size:len(authMagic)+sha256.Size+4], hello[helloLen-nonceLen:]
	from := int(int32(binary.BigEndian.Uint32(fromBytes)))
	refuse := func(status byte, why string) (int, error) {
		return -1, &authRefusal{from: from, why: why, status: status}
	}
	switch {
	case !hmac.Equal(magic, authMagic[:]):
		return -1, &authRefusal{from: -1, why: "not a gorun comm handshake"}
	case !hmac.Equal(round, a.round[:]):
		return refuse(statusOtherRound, "another round (a worker of an earlier restart, or of another job?)")
	case !isPeer(from):
		return refuse(statusNotPeer, fmt.Sprintf("rank %d is not a peer of rank %d", from, self))
	}
	var reply [replyLen]byte
	ln := reply[1 : 1+nonceLen]
	if _, err := rand.Read(ln); err != nil {
		return -1, fmt.Errorf("nonce: %w", err)
	}
	copy(reply[1+nonceLen:], a.proof("listener", role, int32(from), int32(self), dn, ln))
	if _, err := c.Write(reply[:]); err != nil {
		return -1, err
	}
	var got [macLen]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return -1, &authRefusal{from: from, why: fmt.Sprintf("handshake not finished (%v): %v", err, ErrAuthFailed)}
	}
	if !hmac.Equal(got[:], a.proof("dialer", role, int32(from), int32(self), dn, ln)) {
		return refuse(statusRefused, ErrAuthFailed.Error())
	}
	if _, err := c.Write([]byte{statusOK}); err != nil {
		return -1, err
	}
	return from, c.SetDeadline(time.Time{})
}

// dial runs the dialer's side on c as rank from, towards the listener of
// role at rank to. It fails with ErrAuthFailed when either side's proof
// does not hold (the two ends do not share the secret).
func (a auth) dial(c net.Conn, role byte, from, to int, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var hello [helloLen]byte
	copy(hello[:], authMagic[:])
	copy(hello[len(authMagic):], a.round[:])
	binary.BigEndian.PutUint32(hello[len(authMagic)+sha256.Size:], uint32(int32(from)))
	dn := hello[helloLen-nonceLen:]
	if _, err := rand.Read(dn); err != nil {
		return fmt.Errorf("nonce: %w", err)
	}
	if _, err := c.Write(hello[:]); err != nil {
		return err
	}
	var reply [replyLen]byte
	if _, err := io.ReadFull(c, reply[:1]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if err := statusError(reply[0], from); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, reply[1:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	ln, theirs := reply[1:1+nonceLen], reply[1+nonceLen:]
	listenerOK := hmac.Equal(theirs, a.proof("listener", role, int32(from), int32(to), dn, ln))
	// Send our proof even when theirs is wrong: the listener then logs a
	// refusal rather than a broken connection.
	if _, err := c.Write(a.proof("dialer", role, int32(from), int32(to), dn, ln)); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	var verdict [1]byte
	_, verr := io.ReadFull(c, verdict[:])
	if !listenerOK {
		return fmt.Errorf("%w (the other end does not prove it holds this job's secret)", ErrAuthFailed)
	}
	if verr != nil {
		return fmt.Errorf("handshake: %w", verr)
	}
	if err := statusError(verdict[0], from); err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}

// statusError is what a dialer learns from a listener's status byte.
func statusError(status byte, from int) error {
	switch status {
	case statusOK:
		return nil
	case statusOtherRound:
		return errors.New("refused: it runs another round (TORCHELASTIC_RUN_ID or TORCHELASTIC_RESTART_COUNT differ: a worker of an earlier round?)")
	case statusNotPeer:
		return fmt.Errorf("refused: rank %d is not one of its peers (RANK or WORLD_SIZE differ?)", from)
	case statusRefused:
		return fmt.Errorf("refused: %w", ErrAuthFailed)
	}
	return fmt.Errorf("handshake: status %d (not a gorun comm peer?)", status)
}

// pendingConns are a listener's connections in their handshake: closed
// at once when the listener's owner shuts down, so nobody waits for a
// silent peer's handshake timeout.
type pendingConns struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// add tracks c; after closeAll it closes c and returns false.
func (p *pendingConns) add(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.conns[c] = struct{}{}
	return true
}

// done stops tracking c (its handshake is over).
func (p *pendingConns) done(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// closeAll closes every tracked connection, and every later one.
func (p *pendingConns) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
