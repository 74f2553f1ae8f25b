package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/rs/zerolog"
)

// freePortPair returns a port P of 127.0.0.1 such that P and P+1 were both
// free a moment ago (etcd's client and peer ports).
func freePortPair() (int, error) {
	for try := 0; try < 50; try++ {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)))
		_ = a.Close()
		if err == nil {
			_ = b.Close()
			return p, nil
		}
	}
	return 0, errors.New("free port: no two consecutive free ports of 127.0.0.1 in 50 tries")
}

// freePort returns a port of addr that was free a moment ago; it is the
// agents' FreePort (MASTER_PORT of node rank 0).
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("free port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portsCmd(_ context.Context, args []string) error {
	fs := newFlags("ports")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := freePortPair()
	if err != nil {
		return err
	}
	fmt.Println(p)
	return nil
}

// serveCmd runs one embedded etcd member on 127.0.0.1 (fsync on, as a
// job's embedded member runs) until ctx ends or its parent dies.
func serveCmd(ctx context.Context, args []string) error {
	fs := newFlags("serve")
	dir := fs.String("dir", "", "data dir (removed on exit)")
	endpointFile := fs.String("endpoint-file", "", "write the client endpoint here once etcd serves")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *endpointFile == "" {
		return errors.New("-dir and -endpoint-file are required")
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	return runEmbeddedEtcd(ctx, *dir, *endpointFile, log)
}

// writeAtomically writes data to path through a temporary file and a
// rename, so a reader never sees it half written.
func writeAtomically(path, data string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
