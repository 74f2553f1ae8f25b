package launcher

import (
	"encoding/hex"
	"net"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/slurm"
)

// EmbeddedMember is one node of a job that hosts an etcd member.
type EmbeddedMember struct {
	Name       string // member name: the node name
	Host       string // the node name, as in the nodelist
	ClientPort int
	PeerPort   int
}

// EmbeddedPlan says which nodes of a job host etcd members and where
// clients find them.
type EmbeddedPlan struct {
	Members   []EmbeddedMember
	Endpoints []string // client host:port of every member, in Members order
}

// embeddedQuorum is the number of members of a job's embedded etcd on
// three nodes or more: it survives the loss of any one of them.
const embeddedQuorum = 3

// PlanEmbedded places a job's embedded etcd: one member on the first node
// for one or two nodes, a three-member cluster on the first three nodes
// otherwise (it survives the loss of any one of them). Its ports are the
// job's (slurm.JobPorts: a pure function of jobID, in 30000-32767); every
// member uses the same pair, which is safe because each binds its own
// node's address. No nodes: an empty plan.
func PlanEmbedded(jobID string, nodes []string) EmbeddedPlan {
	ports := slurm.JobPorts(jobID)
	count := 1
	if len(nodes) >= embeddedQuorum {
		count = embeddedQuorum
	}
	count = min(count, len(nodes))
	var p EmbeddedPlan
	for _, node := range nodes[:count] {
		p.Members = append(p.Members, EmbeddedMember{Name: node, Host: node, ClientPort: ports.EtcdClient, PeerPort: ports.EtcdPeer})
		p.Endpoints = append(p.Endpoints, net.JoinHostPort(node, strconv.Itoa(ports.EtcdClient)))
	}
	return p
}

// MemberFor returns the member that host runs, if any.
func (p EmbeddedPlan) MemberFor(host string) (EmbeddedMember, bool) {
	for _, m := range p.Members {
		if m.Host == host {
			return m, true
		}
	}
	return EmbeddedMember{}, false
}

// ServerConfig returns the configuration member m of the plan starts with:
// listening on its host's address, the plan's members as the initial
// cluster, the launch's cluster token (ClusterToken), its data in dataDir
// (a directory the caller claimed for this launch and removes itself).
func (p EmbeddedPlan) ServerConfig(m EmbeddedMember, token, dataDir string, log zerolog.Logger) etcdembed.Config {
	cluster := make(map[string]string, len(p.Members))
	for _, o := range p.Members {
		cluster[o.Name] = net.JoinHostPort(o.Host, strconv.Itoa(o.PeerPort))
	}
	return etcdembed.Config{
		Name:           m.Name,
		DataDir:        dataDir,
		ClientAddr:     net.JoinHostPort(m.Host, strconv.Itoa(m.ClientPort)),
		PeerAddr:       cluster[m.Name],
		InitialCluster: cluster,
		ClusterToken:   token,
		Log:            log,
	}
}

// ClusterToken is the etcd cluster token of one launch's embedded etcd:
// the run id, SLURM's restart count, and, with a job secret, a key
// derived from it (fresh for every run of an sbatch script). etcd derives
// the cluster and member ids from it, so the members of one launch
// refuse the raft messages of a member left over from another launch of
// the same run id (a requeued job, a job id SLURM hands out again), which
// would otherwise bring its old log and its old secret into the new
// cluster.
func ClusterToken(runID string, generation int, secret jobsecret.Secret) string {
	token := etcdembed.ClusterTokenPrefix + runID + "-" + strconv.Itoa(generation)
	if !secret.IsZero() {
		token += "-" + hex.EncodeToString(secret.Key("etcd-cluster-token"))[:16]
	}
	return token
}

// dataDirName is the name part of the data dir a member of run runID
// claims (etcdembed.ClaimDataDir).
func dataDirName(runID string, m EmbeddedMember) string {
	return safeName(runID) + "-" + safeName(m.Name)
}

// scratchDir is the node's scratch directory for embedded etcd data:
// $SLURM_TMPDIR, else $TMPDIR, else /tmp. getenv is os.Getenv in
// production.
func scratchDir(getenv func(string) string) string {
	for _, name := range []string{"SLURM_TMPDIR", "TMPDIR"} {
		if dir := getenv(name); dir != "" {
			return dir
		}
	}
	return "/tmp"
}

// safeName keeps a path element to letters, digits, '.', '-' and '_'.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
