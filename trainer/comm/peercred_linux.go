package comm

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// checkSameUser refuses a Unix connection whose other end runs as another
// user. Abstract sockets have no file permissions, so anyone on the node
// may connect: the kernel's SO_PEERCRED says who did (or, on the dialing
// side, who listens).
func checkSameUser(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("process %d runs as uid %d, not as this user (uid %d)", cred.Pid, cred.Uid, os.Getuid())
	}
	return nil
}
