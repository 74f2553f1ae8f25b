// Package etcdtest starts real etcd servers for tests: embedded members on loopback ports and Debian's etcd binary.
package etcdtest
