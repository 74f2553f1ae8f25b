// Package durable copies every Nth complete snapshot of a node's ranks from
// the agent's snapshot directory to a durable directory (shared storage) in
// the background, and the last ones when a job ends unfinished, atomically
// and CRC-checked, keeping the newest complete steps, and reads those copies
// back (Scan, Load).
package durable
