package testutil

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// StablePorts gives distinct ports below the ephemeral range that every
// host can bind.
func TestStablePorts(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	low, err := strconv.Atoi(strings.Fields(string(b))[0])
	require.NoError(t, err)
	hosts := []string{"127.0.0.1", "127.0.0.2"}
	ports, err := StablePorts(3, hosts)
	require.NoError(t, err)
	require.Len(t, ports, 3)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		require.GreaterOrEqual(t, p, lowestStablePort)
		require.Less(t, p, low, "port %d is in the ephemeral range, which starts at %d", p, low)
		for _, h := range hosts {
			l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			require.NoError(t, err)
			require.NoError(t, l.Close())
		}
	}
}
