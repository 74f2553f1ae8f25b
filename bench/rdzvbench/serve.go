package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous/etcdembed"
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
	var server *etcdembed.Server
	var lastErr error
	for try := 0; try < 5 && server == nil; try++ {
		p, err := freePortPair()
		if err != nil {
			return err
		}
		server, lastErr = etcdembed.Start(ctx, etcdembed.Config{
			Name:          "bench",
			DataDir:       filepath.Join(*dir, fmt.Sprintf("etcd-%d", p)),
			RemoveDataDir: true,
			ClientAddr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(p)),
			PeerAddr:      net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)),
			Log:           log,
		})
		if lastErr != nil && !strings.Contains(lastErr.Error(), "address already in use") {
			return lastErr
		}
	}
	if server == nil {
		return lastErr
	}
	defer server.Close()
	ep := server.Endpoints()[0]
	tmp := *endpointFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(ep+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, *endpointFile); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-server.Err():
		return fmt.Errorf("etcd: %w", err)
	}
}
