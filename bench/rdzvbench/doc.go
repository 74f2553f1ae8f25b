// Command rdzvbench measures gorun's etcd rendezvous for bench/rendezvous.sh: round time, watch events per agent and the etcd's cost with N in-process agents, node loss among N in-process agents and among real gorun agents, and jobs under gorun beside torchrun (2 nodes x 2 workers, and N nodes x 1 worker).
package main
