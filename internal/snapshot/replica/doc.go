// Package replica copies a node's ranks' newest complete snapshots to other
// nodes' agents over authenticated TCP (Push to a Server), and reads one
// back (Fetch), so that the ranks of a lost node restore from a peer.
package replica
