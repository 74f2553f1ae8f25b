// Package rendezvous forms the rounds of an elastic job over etcd v3: who takes part, with which node rank, and where the master is.
package rendezvous
