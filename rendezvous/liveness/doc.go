// Package liveness is how one agent judges its peers beside the round
// protocol: it probes a peer's agent (package reach) and tells a refused
// probe (the agent is gone) from an unanswered one (a suspicion), reports
// the unreachable through the protocol's Report and has a gone agent's
// registration removed through its Fence, keeps a node that was left out
// of the job from joining again until it reaches every member (Gate), and
// times how long a node has been the job's straggler (EvictionClock).
// It holds no keys of its own: the protocol (package rendezvous) writes
// what it decides.
package liveness
