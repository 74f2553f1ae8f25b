package agentmetrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server serves /metrics on one address until Close.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// shutdownTimeout bounds how long Close waits for scrapes in flight.
const shutdownTimeout = 2 * time.Second

// Serve listens on addr (HOST:PORT; port 0 picks a free one) and serves
// h at /metrics. It fails at once when addr cannot be listened on.
func Serve(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server, letting scrapes in flight finish for a short
// while, and returns when it no longer serves.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("metrics: serve: %w", serr))
	}
	if err != nil {
		return fmt.Errorf("metrics: close: %w", err)
	}
	return nil
}
