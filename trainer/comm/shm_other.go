//go:build !linux

package comm

import (
	"errors"
	"net"
	"time"
)

type shmRing struct {
	mem  []byte
	seq  uint64
	free int
}

const shmSlots = 2

func (r *shmRing) slot(uint64) []byte { return nil }
func (r *shmRing) close() error       { return nil }

func newShmSender(*net.UnixConn, time.Duration) (*shmRing, error) {
	return nil, errors.New("shared memory links need Linux")
}

func newShmReceiver(*net.UnixConn, time.Duration) (*shmRing, error) {
	return nil, errors.New("shared memory links need Linux")
}
