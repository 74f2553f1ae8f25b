// Package rendezvous forms the rounds of an elastic job over a Store (etcd v3 through package etcdstore): who takes part, with which node rank, and where the master is.
package rendezvous
