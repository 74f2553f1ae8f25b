package reach

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// silent accepts connections and never answers: a node whose packets
// back never arrive looks like this to a probe.
func silent(t *testing.T) int { return testutil.SilentPort(t) }

// closedPort is a port nobody listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func TestProbe(t *testing.T) {
	r, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tests := []struct {
		name    string
		port    int
		reached bool
	}{
		{"an agent answers", r.Port(), true},
		{"nobody listens", closedPort(t), false},
		{"connected but no answer (one way lost)", silent(t), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Probe(context.Background(), "127.0.0.1", tc.port, 300*time.Millisecond)
			if (err == nil) != tc.reached {
				t.Fatalf("Probe: %v, want reached=%v", err, tc.reached)
			}
		})
	}
}

func TestProbeEndsWithItsContext(t *testing.T) {
	port := silent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Probe(ctx, "127.0.0.1", port, time.Hour); err == nil {
		t.Fatal("a probe with its context ended reached a silent peer")
	}
}

func TestCloseStopsAnswering(t *testing.T) {
	r, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port := r.Port()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Probe(context.Background(), "127.0.0.1", port, time.Second); err == nil {
		t.Fatal("a closed listener answered")
	}
}
