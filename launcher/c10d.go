package launcher

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// c10dDefaultPort is torchrun's port for a c10d --rdzv-endpoint given
// without one.
const c10dDefaultPort = 29400

// hostAtEndpoint turns torchrun's c10d rendezvous at --rdzv-endpoint
// HOST:PORT into gorun's etcd rendezvous over a one-member embedded etcd
// that the node owning HOST's address runs (ownsEndpoint), the others
// being its clients. The member serves clients at HOST:PORT, the address
// every node of the torchrun recipe already dials, and listens for peers
// at HOST:PORT+1: a one-member cluster has no peer to talk to, but etcd
// binds a peer listener all the same, and PORT+1 keeps the pair together
// as the SLURM plan does (client, client+1). The port torchrun's store
// would take is then free, so the workers' store (MASTER_PORT, picked by
// node rank 0 each round) never collides with it.
func (l *Launch) hostAtEndpoint(opts Options, host Host) error {
	r := &l.Rendezvous
	endpoint := strings.TrimSpace(opts.RdzvEndpoint)
	if strings.Contains(endpoint, ",") {
		return usagef("--rdzv-endpoint=%s: --rdzv-backend=c10d takes one HOST:PORT, the node that hosts the rendezvous (for an etcd cluster: --rdzv-backend=etcd)", opts.RdzvEndpoint)
	}
	h, port, err := splitHostPort(endpoint)
	if err != nil {
		return usagef("--rdzv-endpoint: %v", err)
	}
	if h == "" {
		return usagef("--rdzv-endpoint=%s: no host: give the address of the node that hosts the rendezvous", opts.RdzvEndpoint)
	}
	if port == 0 {
		return usagef("--rdzv-endpoint=%s: port 0 (a free port) works for one node only: every node of --nnodes=%s must dial the same port", opts.RdzvEndpoint, orDefault(opts.NNodes, strconv.Itoa(l.MaxNodes)))
	}
	if port < 0 {
		port = c10dDefaultPort
	}
	if port == 65535 {
		return usagef("--rdzv-endpoint=%s: the rendezvous also needs port+1 on that node for its etcd peer listener: pick a port below 65535", opts.RdzvEndpoint)
	}
	member := EmbeddedMember{Name: h, Host: h, ClientPort: port, PeerPort: port + 1}
	clientAddr := net.JoinHostPort(h, strconv.Itoa(port))
	r.Embedded = &EmbeddedPlan{Members: []EmbeddedMember{member}, Endpoints: []string{clientAddr}}
	r.Endpoints = r.Embedded.Endpoints
	owns, why, err := l.ownsEndpoint(h, opts, host)
	if err != nil {
		return err
	}
	where := fmt.Sprintf("embedded etcd at the c10d endpoint %s (peers: port %d)", clientAddr, port+1)
	if owns {
		r.Member = &member
		_, told := r.Conf[confIsHost]
		r.HostGuessed = !told
		r.Hosting = where + ", run by this node: " + why
	} else {
		r.Hosting = where + ", run by another node (this node is a client): " + why
	}
	return nil
}

// ownsEndpoint says whether this node hosts the c10d endpoint at host h,
// and why, by these rules in order:
//
//  1. --rdzv-conf is_host=true|false (torchrun's key) decides;
//  2. h is this node's name, or resolves to an address of this node's
//     --local-addr (else of its name): it hosts;
//  3. h resolves to a loopback address: it hosts when no --local-addr was
//     given (loopback is every machine's own); agents that share one
//     machine tell themselves apart by their --local-addr, so one that
//     gave another address does not;
//  4. h resolves to an address of one of this machine's interfaces: it
//     hosts; else it is a client.
func (l *Launch) ownsEndpoint(h string, opts Options, host Host) (bool, string, error) {
	if v, ok := l.Rendezvous.Conf[confIsHost]; ok {
		b, err := parseConfBool(v)
		if err != nil {
			return false, "", usagef("--rdzv-conf %s=%s: want true or false", confIsHost, v)
		}
		return b, fmt.Sprintf("--rdzv-conf %s=%s", confIsHost, v), nil
	}
	if strings.EqualFold(h, l.Host) {
		return true, fmt.Sprintf("the endpoint's host %s is this node's name", h), nil
	}
	want, err := lookupIPs(host, h)
	if err != nil {
		return false, "", usagef("--rdzv-endpoint: cannot resolve %s, the host of the rendezvous: %v", h, err)
	}
	addrFlag := "--local-addr"
	if opts.LocalAddr == "" {
		addrFlag = "node name"
	}
	own, _ := lookupIPs(host, l.Addr) // a name that does not resolve owns nothing
	if ip, ok := commonIP(want, own); ok {
		return true, fmt.Sprintf("the endpoint's address %s is this node's %s %s", ip, addrFlag, l.Addr), nil
	}
	if slices.ContainsFunc(want, net.IP.IsLoopback) {
		if opts.LocalAddr != "" {
			return false, fmt.Sprintf("the endpoint's loopback address %s is not this node's --local-addr %s", want[0], opts.LocalAddr), nil
		}
		return true, fmt.Sprintf("the endpoint's address %s is loopback, this machine's own (agents sharing a machine: give each its --local-addr)", want[0]), nil
	}
	ifaces, err := interfaceIPs(host)
	if err != nil {
		return false, "", fmt.Errorf("list this machine's addresses to find who hosts the c10d endpoint: %w", err)
	}
	if ip, ok := commonIP(want, ifaces); ok {
		return true, fmt.Sprintf("the endpoint's address %s is on one of this machine's interfaces", ip), nil
	}
	return false, fmt.Sprintf("the endpoint's address %s is not this node's", want[0]), nil
}

// lookupIPs resolves name to its addresses; an IP literal is itself.
func lookupIPs(host Host, name string) ([]net.IP, error) {
	if ip := net.ParseIP(name); ip != nil {
		return []net.IP{ip}, nil
	}
	if host.LookupIP == nil {
		return nil, fmt.Errorf("resolve %s: no resolver", name)
	}
	ips, err := host.LookupIP(name)
	if err == nil && len(ips) == 0 {
		err = fmt.Errorf("resolve %s: no address", name)
	}
	return ips, err
}

// interfaceIPs lists the addresses of this machine's interfaces.
func interfaceIPs(host Host) ([]net.IP, error) {
	if host.IfaceAddrs == nil {
		return nil, nil
	}
	addrs, err := host.IfaceAddrs()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips, nil
}

// commonIP returns the first address of a that is also in b.
func commonIP(a, b []net.IP) (net.IP, bool) {
	for _, x := range a {
		if slices.ContainsFunc(b, x.Equal) {
			return x, true
		}
	}
	return nil, false
}

// clientFallback says whether this node, having failed with err to start
// the c10d endpoint's embedded etcd member, goes on as a client instead,
// as torchrun's c10d rendezvous does when its heuristic host cannot bind
// the endpoint: the node took itself for the host by ownsEndpoint's rules
// (an explicit --rdzv-conf is_host is obeyed, and fails), and a port of
// the member was taken, most likely by another agent of the job on this
// machine, which then hosts it.
func (r Rendezvous) clientFallback(err error) bool {
	return r.Member != nil && r.HostGuessed && errors.Is(err, syscall.EADDRINUSE)
}
