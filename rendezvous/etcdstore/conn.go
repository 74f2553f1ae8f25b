package etcdstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Conn is one agent's connection to etcd, and every use gorun makes of it
// besides a job's Store: entering a run id's incarnation (Enter), opening
// the Store of one agent in it (NewStore), waiting for the others to
// leave and keeping a finished run's keys (AwaitDeparture,
// RetainIfDeserted). Callers outside the rendezvous/etcd* packages hold a
// Conn, never an etcd client. Its methods may be called concurrently.
type Conn struct {
	client *clientv3.Client
}

// Connect dials etcd as Dial does (same patience, same errors, ctx only
// bounds the dial) and returns the connection; the caller closes it.
func Connect(ctx context.Context, cfg ClientConfig) (*Conn, error) {
	client, err := Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Conn{client: client}, nil
}

// NewConn is the Conn over a client dialled elsewhere (a test's or a
// benchmark's own); Close closes the client.
func NewConn(client *clientv3.Client) *Conn { return &Conn{client: client} }

// Close closes the connection; Stores opened over it stop working.
func (c *Conn) Close() error { return c.client.Close() }

// Unauthenticated says whether etcd answered, within ctx, that it runs
// without authentication: any user who reaches it can read and change
// every key. No answer (an error or ctx ending) says false.
func (c *Conn) Unauthenticated(ctx context.Context) bool {
	st, err := c.client.AuthStatus(ctx)
	return err == nil && !st.Enabled
}
