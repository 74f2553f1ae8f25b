// Package etcdstore is the rendezvous's Store over an etcd v3 client: dialling etcd, one agent's leased session that outlives outages, a run id's incarnations, and reading a job's status.
//
// Conn is the connection: callers outside the rendezvous/etcd* packages hold one, never an etcd client.
package etcdstore
