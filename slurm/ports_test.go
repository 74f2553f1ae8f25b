package slurm

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJobPorts(t *testing.T) {
	for _, tc := range []struct {
		job  string
		want Ports
	}{
		{"0", Ports{Master: 15000, EtcdClient: 30000, EtcdPeer: 30001}},
		{"7", Ports{Master: 15007, EtcdClient: 30014, EtcdPeer: 30015}},
		{"77", Ports{Master: 15077, EtcdClient: 30154, EtcdPeer: 30155}},
		{"1383", Ports{Master: 16383, EtcdClient: 32766, EtcdPeer: 32767}}, // the last etcd pair
		{"1384", Ports{Master: 16384, EtcdClient: 30000, EtcdPeer: 30001}}, // wraps
		{"14999", Ports{Master: 29999, EtcdClient: 30000 + 2*(14999%1384), EtcdPeer: 30001 + 2*(14999%1384)}},
		{"123456", Ports{Master: 15000 + 123456%15000, EtcdClient: 30000 + 2*(123456%1384), EtcdPeer: 30001 + 2*(123456%1384)}},
	} {
		t.Run(tc.job, func(t *testing.T) {
			require.Equal(t, tc.want, JobPorts(tc.job))
		})
	}
}

// Every id, numeric or not, gets ports in their ranges, and the ranges do
// not overlap: a worker's store never takes an embedded etcd's port.
func TestJobPortsRanges(t *testing.T) {
	ids := []string{"", "job-α", "not-a-number", "-1", "18446744073709551615", "18446744073709551616", "gorun-0a1b2c3d4e5f"}
	for n := range 3000 {
		ids = append(ids, strconv.Itoa(n*37))
	}
	for _, id := range ids {
		p := JobPorts(id)
		require.Equal(t, p, JobPorts(id), "deterministic")
		require.GreaterOrEqual(t, p.Master, 15000, id)
		require.LessOrEqual(t, p.Master, 29999, id)
		require.GreaterOrEqual(t, p.EtcdClient, 30000, id)
		require.Equal(t, p.EtcdClient+1, p.EtcdPeer, id)
		require.LessOrEqual(t, p.EtcdPeer, 32767, id)
		require.Zero(t, (p.EtcdClient-30000)%2, "pairs do not overlap: %s", id)
	}
	require.Less(t, masterPortMax, etcdPortMin)
}

// Consecutive SLURM job ids get different ports; so do other ids.
func TestJobPortsTellJobsApart(t *testing.T) {
	master, etcd := map[int]string{}, map[int]string{}
	for _, job := range []string{"100", "101", "102", "103", "abc", "abd"} {
		p := JobPorts(job)
		require.NotContains(t, master, p.Master, "job %s has the master port of job %s", job, master[p.Master])
		require.NotContains(t, etcd, p.EtcdClient, "job %s has the etcd ports of job %s", job, etcd[p.EtcdClient])
		master[p.Master], etcd[p.EtcdClient] = job, job
	}
}

// Both ranges sit below the kernel's ephemeral ports here.
func TestJobPortsBelowEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	low, err := strconv.Atoi(strings.Fields(string(b))[0])
	require.NoError(t, err)
	require.Greater(t, low, etcdPortMax, "ephemeral ports start at %d, inside the embedded etcd range", low)
}
