package replica

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Auth is what the two ends of a replication connection must share: the
// job's run id and its secret. Connections between agents of different
// runs, or with different secrets, are refused by both ends.
type Auth struct {
	// RunID is the job's run id (rendezvous id); proofs are bound to it.
	RunID string
	// Secret is key material every agent of the job holds: the agent
	// passes its job secret's key for this use
	// (jobsecret.Secret.Key("snapshot-replica")). Empty means no secret:
	// the key is then a fixed public one, which guards against a peer of
	// another run or a stray connection, not against an attacker (as
	// trainer/comm does without GORUN_JOB_SECRET).
	Secret []byte
}

// ErrAuth says that the other end does not hold this job's secret (or is
// no replica end of this job at all).
var ErrAuth = errors.New("replica: authentication failed: the other end does not hold this job's secret (GORUN_JOB_SECRET differs?)")

// The handshake: a mutual HMAC-SHA256 challenge-response, in fixed-size
// messages, before the listener reads or allocates anything else.
//
//	dialer   -> listener  hello: magic, role, SHA-256 of the run id, nonce D
//	listener -> dialer    verdict; when OK: nonce L, proof L
//	dialer   -> listener  proof D
//	listener -> dialer    verdict
//
// proof X = HMAC(key, prefix, X's side, role, run hash, D, L). Both nonces
// are fresh random bytes, so a proof seen once is of no use on any other
// connection, and the role byte keeps a push handshake from standing for
// a fetch's.
const (
	nonceLen    = 32
	proofLen    = sha256.Size
	helloLen    = len(magic) + 1 + sha256.Size + nonceLen
	magic       = "GORUNRP1"
	proofPrefix = "gorun snapshot replica v1"

	// handshakeTimeout bounds each end's wait for the other's handshake.
	handshakeTimeout = 10 * time.Second
)

// role is what a dialer comes for.
type role byte

const (
	rolePush  role = 'p'
	roleFetch role = 'f'
)

func (r role) String() string {
	switch r {
	case rolePush:
		return "push"
	case roleFetch:
		return "fetch"
	}
	return fmt.Sprintf("role %#02x", byte(r))
}

// keys are an Auth turned into what the handshake uses.
type keys struct {
	key []byte
	run [sha256.Size]byte
}

func (a Auth) keys() keys {
	m := hmac.New(sha256.New, a.Secret)
	m.Write([]byte(proofPrefix + " key"))
	return keys{key: m.Sum(nil), run: sha256.Sum256([]byte(proofPrefix + " run: " + a.RunID))}
}

// proof is the HMAC that side sends.
func (k keys) proof(side string, r role, dn, ln []byte) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(proofPrefix + " " + side))
	m.Write([]byte{byte(r)})
	m.Write(k.run[:])
	m.Write(dn)
	m.Write(ln)
	return m.Sum(nil)
}

// refusal is why a listener turned a dialer away: the listener logs it,
// then tells the dialer its status (so the dialer's error never comes
// before the listener's line) and closes the connection.
type refusal struct {
	status status
	why    string
}

func (e *refusal) Error() string { return e.why }

// accept runs the listener's side of the handshake on c and returns the
// role the dialer proved it may take, or a *refusal, or an I/O error.
func (k keys) accept(c net.Conn) (role, error) {
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return 0, err
	}
	var hello [helloLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return 0, &refusal{why: fmt.Sprintf("no handshake (%v)", err)}
	}
	m, rest := hello[:len(magic)], hello[len(magic):]
	r, run, dn := role(rest[0]), rest[1:1+sha256.Size], rest[1+sha256.Size:]
	switch {
	case string(m) != magic:
		return 0, &refusal{why: "not a gorun snapshot replica handshake"}
	case r != rolePush && r != roleFetch:
		return 0, &refusal{status: statusBadRequest, why: fmt.Sprintf("unknown %v", r)}
	case !hmac.Equal(run, k.run[:]):
		return 0, &refusal{status: statusOtherRun, why: "a " + r.String() + " of another run (another job's agent?)"}
	}
	var reply [nonceLen + proofLen]byte
	ln := reply[:nonceLen]
	if _, err := rand.Read(ln); err != nil {
		return 0, fmt.Errorf("nonce: %w", err)
	}
	copy(reply[nonceLen:], k.proof("listener", r, dn, ln))
	if err := writeVerdict(c, statusOK, ""); err != nil {
		return 0, err
	}
	if _, err := c.Write(reply[:]); err != nil {
		return 0, err
	}
	var got [proofLen]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return 0, &refusal{why: fmt.Sprintf("handshake of a %v not finished (%v)", r, err)}
	}
	if !hmac.Equal(got[:], k.proof("dialer", r, dn, ln)) {
		return 0, &refusal{status: statusAuth, why: fmt.Sprintf("a %v: %v", r, ErrAuth)}
	}
	if err := writeVerdict(c, statusOK, ""); err != nil {
		return 0, err
	}
	return r, c.SetDeadline(time.Time{})
}

// dial runs the dialer's side of the handshake on c, for role r. It fails
// with ErrAuth when either proof does not hold, and with the listener's
// reason when it refuses.
func (k keys) dial(c net.Conn, r role) error {
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	var hello [helloLen]byte
	copy(hello[:], magic)
	hello[len(magic)] = byte(r)
	copy(hello[len(magic)+1:], k.run[:])
	dn := hello[helloLen-nonceLen:]
	if _, err := rand.Read(dn); err != nil {
		return fmt.Errorf("nonce: %w", err)
	}
	if _, err := c.Write(hello[:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if err := readVerdict(c, "handshake"); err != nil {
		return err
	}
	var reply [nonceLen + proofLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	ln, theirs := reply[:nonceLen], reply[nonceLen:]
	listenerOK := hmac.Equal(theirs, k.proof("listener", r, dn, ln))
	// Send our proof even when theirs is wrong: the listener then logs a
	// refusal rather than a broken connection.
	if _, err := c.Write(k.proof("dialer", r, dn, ln)); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	verr := readVerdict(c, "handshake")
	if !listenerOK {
		return fmt.Errorf("%w (its proof is wrong)", ErrAuth)
	}
	if verr != nil {
		return verr
	}
	return c.SetDeadline(time.Time{})
}
