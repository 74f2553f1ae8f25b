package launcher

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A static launch whose MASTER_PORT is taken on worker rank 0's node
// fails before starting a worker, naming the port; a free one launches.
func TestStaticLaunchNamesATakenMasterPort(t *testing.T) {
	held, err := net.Listen("tcp", ":0")
	require.NoError(t, err)
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port

	l, err := Resolve(Options{
		NProcPerNode: "1", NodeRank: -1, Standalone: true, MasterPort: port, NoPython: true,
		Entrypoint: "true", TermTimeout: 5 * time.Second,
	}, LocalHost())
	require.NoError(t, err)
	require.Equal(t, port, l.MasterPort)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, l, Runtime{Stdout: &out, Stderr: &out, Log: zerolog.Nop()})
	require.ErrorContains(t, err, "MASTER_PORT "+strconv.Itoa(port)+" is already in use on this node")
	require.Equal(t, 1, res.ExitCode)
	require.Empty(t, out.String(), "no worker started")

	require.NoError(t, held.Close())
	res, err = Run(ctx, l, Runtime{Stdout: &out, Stderr: &out, Log: zerolog.Nop()})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode)
}
