//go:build !linux

package comm

import "net"

// checkSameUser has nothing to check: Unix sockets between ranks are used
// on Linux only.
func checkSameUser(net.Conn) error { return nil }
