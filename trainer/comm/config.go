package comm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
)

// DefaultTimeout bounds every wait for a peer when Config.Timeout is zero.
const DefaultTimeout = 2 * time.Minute

// Config is what one worker knows from the environment contract.
type Config struct {
	Rank, WorldSize int
	// MasterAddr and MasterPort are where rank 0 hosts the bootstrap store
	// that every rank registers with once, to learn its peers' addresses.
	MasterAddr string
	MasterPort int
	// BindAddr is the IP address this rank listens on for its peers. It
	// must be this node's own address, never a wildcard (nodes may share
	// one port space). Empty: the local address this rank reaches the
	// master from.
	BindAddr string
	// Token names the round (run id + restart count). It is public: the
	// handshake binds it, so a stale worker of an earlier round is refused
	// as "another round" and cannot join or disturb this one.
	Token string
	// Secret is the job secret (GORUN_JOB_SECRET). Every connection, to
	// the store and between ranks, begins with a mutual HMAC
	// challenge-response on it, before anything else is read from the
	// peer; a peer without it is refused with ErrAuthFailed. The zero
	// Secret authenticates nothing: any process that knows Token can join
	// a world whose ranks all have no secret.
	Secret jobsecret.Secret
	// Log receives one line per connection a listener of this rank
	// refused (from where, and why); nil discards them.
	Log io.Writer
	// Timeout bounds any wait for a peer: connecting, and each send or
	// receive inside a collective. A peer silent for longer is reported
	// by rank. Zero means DefaultTimeout.
	Timeout time.Duration
	// TCPOnly disables Unix sockets between ranks of one node (they are
	// used by default because they move data faster than loopback TCP).
	TCPOnly bool
	// SilentAfter, when positive, is how long a peer may send nothing on
	// its control connection (whose heartbeats then come at least four
	// times as often) before OnSilent is called with its rank. It fails
	// nothing: the world goes on waiting for the peer up to Timeout.
	SilentAfter time.Duration
	// OnSilent is called once per silence, from the world's heartbeat
	// goroutine (it must not block), with the rank of a peer that sent
	// nothing for SilentAfter; again only after that peer was heard from.
	OnSilent func(rank int)
}

// ConfigFrom builds a Config from the worker environment contract and the
// job secret: the token is the run id and the restart count.
func ConfigFrom(w distenv.Worker, secret jobsecret.Secret) Config {
	return Config{
		Rank: w.Rank, WorldSize: w.WorldSize,
		MasterAddr: w.MasterAddr, MasterPort: w.MasterPort,
		Token:  w.RunID + "/" + strconv.Itoa(w.RestartCount),
		Secret: secret,
	}
}

// Validate reports the first bad field of c.
func (c Config) Validate() error {
	switch {
	case c.WorldSize < 1:
		return fmt.Errorf("comm: world size %d < 1", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("comm: rank %d outside world size %d", c.Rank, c.WorldSize)
	case c.MasterAddr == "":
		return errors.New("comm: no master address")
	case c.MasterPort <= 0 || c.MasterPort > 65535:
		return fmt.Errorf("comm: master port %d outside 1..65535", c.MasterPort)
	case c.Token == "":
		return errors.New("comm: no token (run id + restart count)")
	case c.Timeout < 0:
		return fmt.Errorf("comm: negative timeout %s", c.Timeout)
	case c.SilentAfter < 0:
		return fmt.Errorf("comm: negative silence bound %s", c.SilentAfter)
	}
	if c.BindAddr != "" {
		ip := net.ParseIP(c.BindAddr)
		if ip == nil {
			return fmt.Errorf("comm: bind address %q is not an IP address", c.BindAddr)
		}
		if ip.IsUnspecified() {
			return fmt.Errorf("comm: bind address %s is a wildcard: give this node's own address", c.BindAddr)
		}
	}
	return nil
}

func (c Config) timeout() time.Duration {
	if c.Timeout == 0 {
		return DefaultTimeout
	}
	return c.Timeout
}
