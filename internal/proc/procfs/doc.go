// Package procfs is gorun's one reader of Linux's /proc: a process's stat line (Stat) and its threads' (Threads), its
// environment (Environ) and command line (Cmdline), every process's pid (PIDs), and the live
// processes whose environment carries a marker (Scan).
package procfs
