package launcher

import (
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/slurm"
)

func TestPlanEmbedded(t *testing.T) {
	for _, tc := range []struct {
		nodes   []string
		members []string
	}{
		{nil, nil},
		{[]string{"node1"}, []string{"node1"}},
		{[]string{"node1", "node2"}, []string{"node1"}},
		{[]string{"node1", "node2", "node3"}, []string{"node1", "node2", "node3"}},
		{[]string{"a1", "a2", "a3", "a4", "a5"}, []string{"a1", "a2", "a3"}},
	} {
		t.Run(strconv.Itoa(len(tc.nodes)), func(t *testing.T) {
			for _, job := range []string{"1", "4242", "32767", "job-α", ""} {
				p := PlanEmbedded(job, tc.nodes)
				require.Equal(t, p, PlanEmbedded(job, tc.nodes), "deterministic")
				ports := slurm.JobPorts(job)
				require.Len(t, p.Members, len(tc.members))
				require.Len(t, p.Endpoints, len(tc.members))
				for i, m := range p.Members {
					require.Equal(t, tc.members[i], m.Name)
					require.Equal(t, tc.members[i], m.Host)
					require.Equal(t, ports.EtcdClient, m.ClientPort, "the job's etcd ports")
					require.Equal(t, ports.EtcdPeer, m.PeerPort)
					require.Equal(t, m.Host+":"+strconv.Itoa(m.ClientPort), p.Endpoints[i])
					got, ok := p.MemberFor(m.Host)
					require.True(t, ok)
					require.Equal(t, m, got)
				}
				_, ok := p.MemberFor("elsewhere")
				require.False(t, ok)
			}
		})
	}
}

func TestPlanServerConfig(t *testing.T) {
	p := PlanEmbedded("77", []string{"node1", "node2", "node3", "node4"})
	m, ok := p.MemberFor("node2")
	require.True(t, ok)
	cfg := p.ServerConfig(m, "gorun-rdzv-77", "/scratch/d", zerolog.Nop())
	require.NoError(t, cfg.Validate())
	require.Equal(t, "node2", cfg.Name)
	require.Equal(t, "/scratch/d", cfg.DataDir)
	require.False(t, cfg.RemoveDataDir, "the claimed data dir is released by its claimer")
	require.Equal(t, "node2:30154", cfg.ClientAddr)
	require.Equal(t, "node2:30155", cfg.PeerAddr)
	require.Equal(t, map[string]string{"node1": "node1:30155", "node2": "node2:30155", "node3": "node3:30155"}, cfg.InitialCluster)
	require.Equal(t, "gorun-rdzv-77", cfg.ClusterToken)

	require.Equal(t, "77-node2", dataDirName("77", m))
	require.Equal(t, "a_b-node_1", dataDirName("a/b", EmbeddedMember{Name: "node 1"}))

	require.Equal(t, "/s1", scratchDir(func(k string) string { return map[string]string{"SLURM_TMPDIR": "/s1", "TMPDIR": "/t"}[k] }))
	require.Equal(t, "/t", scratchDir(func(k string) string { return map[string]string{"TMPDIR": "/t"}[k] }))
	require.Equal(t, "/tmp", scratchDir(func(string) string { return "" }))
}

// Every launch of a run id gets its own cluster token: a requeue (SLURM's
// restart count) and every run of an sbatch script (its fresh secret),
// while all members of one launch agree.
func TestClusterToken(t *testing.T) {
	s1, err := jobsecret.New()
	require.NoError(t, err)
	s2, err := jobsecret.New()
	require.NoError(t, err)
	tokens := map[string]string{
		"no secret":       ClusterToken("77", 0, jobsecret.Secret{}),
		"requeued":        ClusterToken("77", 1, jobsecret.Secret{}),
		"secret":          ClusterToken("77", 0, s1),
		"another secret":  ClusterToken("77", 0, s2),
		"another run id":  ClusterToken("78", 0, s1),
		"secret requeued": ClusterToken("77", 1, s1),
	}
	seen := map[string]string{}
	for what, token := range tokens {
		require.True(t, strings.HasPrefix(token, etcdembed.ClusterTokenPrefix), token)
		require.NotContains(t, token, s1.Encode()[:16], "the token does not reveal the secret")
		other, dup := seen[token]
		require.False(t, dup, "%s and %s share token %s", what, other, token)
		seen[token] = what
	}
	require.Equal(t, "gorun-rdzv-77-0", tokens["no secret"])
	require.Equal(t, tokens["secret"], ClusterToken("77", 0, s1), "members of one launch agree")
}
