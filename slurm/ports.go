package slurm

import (
	"hash/fnv"
	"strconv"
)

// Ports are the TCP ports a job derives from its job id, so that every
// node of the job computes the same ones without asking the others. Both
// ranges lie below Linux's default ephemeral range (32768-60999), so no
// outgoing connection takes them, and apart from each other, so a
// worker's store never takes an embedded etcd's port.
type Ports struct {
	// Master is MASTER_PORT, where worker rank 0 hosts the PyTorch
	// store: 15000-29999.
	Master int
	// EtcdClient and EtcdPeer are where the job's embedded etcd members
	// serve clients and each other: a pair (n, n+1) in 30000-32767.
	EtcdClient, EtcdPeer int
}

// The port ranges of Ports.
const (
	masterPortMin = 15000
	masterPortMax = 29999
	etcdPortMin   = 30000
	etcdPortMax   = 32767

	masterPorts   = masterPortMax - masterPortMin + 1
	etcdPortPairs = (etcdPortMax - etcdPortMin + 1) / 2
)

// JobPorts returns the ports of job jobID. A numeric SLURM job id maps
// consecutive jobs (which often share nodes) to consecutive master ports
// and etcd port pairs; any other id (a --rdzv-id) is hashed.
func JobPorts(jobID string) Ports {
	n := jobNumber(jobID)
	client := etcdPortMin + 2*int(n%etcdPortPairs)
	return Ports{
		Master:     masterPortMin + int(n%masterPorts),
		EtcdClient: client,
		EtcdPeer:   client + 1,
	}
}

// jobNumber is a numeric job id's value, else the id's FNV-1a hash.
func jobNumber(jobID string) uint64 {
	if n, err := strconv.ParseUint(jobID, 10, 64); err == nil {
		return n
	}
	h := fnv.New64a()
	h.Write([]byte(jobID))
	return h.Sum64()
}
