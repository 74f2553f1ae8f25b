package comm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// Bounds of one framed message. Frames are read only from peers that
// passed the handshake on the job secret (auth.go), and each read names
// its bound: a peer table of thousands of ranks fits maxTable, everything
// else maxSmall.
const (
	maxTable = 16 << 20
	maxSmall = 64 << 10
)

// writeMsg sends v as one frame: a 4-byte big-endian length, then JSON.
func writeMsg(c net.Conn, v any, timeout time.Duration) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	_, err = c.Write(frame)
	return err
}

// readMsg reads one frame written by writeMsg into v; a frame longer than
// limit is an error, read no further.
func readMsg(c net.Conn, v any, timeout time.Duration, limit uint32) error {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n > limit {
		return fmt.Errorf("message of %d bytes exceeds %d (not a gorun comm peer?)", n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode: %w (not a gorun comm peer?)", err)
	}
	return nil
}

// hello is what a rank tells the bootstrap store once authenticated.
type hello struct {
	Rank      int  `json:"rank"`
	WorldSize int  `json:"world_size"`
	Peer      peer `json:"peer"`
}

// peer is how to reach one rank.
type peer struct {
	Addr string `json:"addr"`           // TCP host:port
	Unix string `json:"unix,omitempty"` // abstract Unix socket name, without '@'; only this user's processes are admitted (SO_PEERCRED)
	Node string `json:"node,omitempty"` // ranks with equal Node may use Unix
}

// table is the store's answer: every rank's address, or why not.
type table struct {
	Error string `json:"error,omitempty"`
	Peers []peer `json:"peers,omitempty"`
}

// Connection kinds in a handshake.
const (
	kindControl = "control" // one per pair of ranks: heartbeats, goodbyes, aborts
	kindData    = "data"    // one per ring link of a group, one direction
)

// handshake follows the authentication on every connection between two
// ranks: which connection this is.
type handshake struct {
	Kind  string `json:"kind"`
	Group string `json:"group,omitempty"`
}

// ack answers a handshake.
type ack struct {
	Error string `json:"error,omitempty"`
}

// control messages between ranks.
type control struct {
	Type   string `json:"t"` // hb, bye, abort
	Blame  int    `json:"blame,omitempty"`
	Reason string `json:"reason,omitempty"`
}
