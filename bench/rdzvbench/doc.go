// Command rdzvbench measures gorun's etcd rendezvous for bench/rendezvous.sh: round time with N in-process agents, node loss to restart with real gorun agents, and a 2 nodes x 2 workers job under gorun and torchrun.
package main
