// Package etcdembed runs an etcd member inside gorun: a job's embedded rendezvous server, or `gorun rendezvous serve`, with etcd's own logs bridged to zerolog.
package etcdembed
