// Package procfs reads gorun's view of processes from Linux's /proc: a process's stat line (Stat)
// and its threads' (Threads), its environment (Environ), command line (Cmdline) and namespaces
// (Namespace), every process's pid (PIDs), and the live processes whose environment carries a
// marker (Scan).
package procfs
