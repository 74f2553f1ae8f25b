package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
)

// netLab is a small network of Linux network namespaces for real network faults: one namespace
// per host (a node or etcd), each with one veth "eth0" whose other end sits on a Linux bridge in a
// bridge namespace of its own, and private addresses 10.77.0.N/24 that exist only inside them.
// Faults are silent packet drops: nftables rules on the bridge's forward hook (family bridge), so
// no host sees a reset or an ICMP error, only silence, as behind a cut cable or a dead switch
// port. A host made withRelay has a netRelay instead of the veth, and can be given a delay
// (Delay). Every name starts with a prefix unique to the test run; t.Cleanup closes the relays
// and deletes the nft table and every namespace, even when the test fails.
type netLab struct {
	t      *testing.T
	prefix string
	bridge string               // the bridge namespace
	addr   map[string]string    // host -> its address
	ns     map[string]string    // host -> its namespace
	relay  map[string]*netRelay // host -> its relay, for the hosts made withRelay
}

// netLabOption changes how newNetLab builds the lab.
type netLabOption func(*netLab)

// withRelay makes hosts' links netRelays (whose delay Delay sets) instead of veths.
func withRelay(hosts ...string) netLabOption {
	return func(l *netLab) {
		for _, h := range hosts {
			l.relay[h] = nil
		}
	}
}

// nftTable is the lab's nft table (family bridge) in the bridge namespace, with one chain,
// faults, on the forward hook.
const nftTable = "netfault"

// requireNetLab skips t unless it can build a netLab: root, and ip and nft on PATH (under
// CI=true a missing one fails t: scripts/test.sh installs iproute2 and nftables).
func requireNetLab(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "network namespaces and nftables need root")
	}
	for _, p := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(p); err != nil {
			testutil.SkipOrFail(t, "%s not found (apt-get install iproute2 nftables)", p)
		}
	}
}

// newNetLab makes the bridge namespace and one namespace per host, host i (from 0) at
// 10.77.0.(i+1), every host reaching every other through the bridge, and the empty faults
// chain.
func newNetLab(t *testing.T, hosts []string, opts ...netLabOption) *netLab {
	t.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	l := &netLab{t: t, prefix: "gnf" + hex.EncodeToString(b[:]), addr: map[string]string{}, ns: map[string]string{},
		relay: map[string]*netRelay{}}
	for _, o := range opts {
		o(l)
	}
	l.bridge = l.prefix + "-br"
	t.Cleanup(l.remove)
	l.ip("netns", "add", l.bridge)
	l.ip("-n", l.bridge, "link", "set", "lo", "up")
	l.ip("-n", l.bridge, "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.bridge, "link", "set", "br0", "up")
	for i, h := range hosts {
		ns := fmt.Sprintf("%s-%s", l.prefix, h)
		port := fmt.Sprintf("port%d", i) // the bridge's end
		addr := fmt.Sprintf("10.77.0.%d", i+1)
		l.ns[h], l.addr[h] = ns, addr
		l.ip("netns", "add", ns)
		if _, ok := l.relay[h]; ok {
			r, err := newNetRelay(ns, "eth0", l.bridge, port)
			if err != nil {
				t.Fatalf("relay for %s: %v", h, err)
			}
			l.relay[h] = r
			// Before l.remove (cleanups run last first): the TAPs go before their namespaces.
			t.Cleanup(func() {
				if err := r.Close(); err != nil {
					t.Errorf("closing %s's relay: %v", h, err)
				}
			})
		} else {
			l.ip("-n", l.bridge, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		}
		l.ip("-n", l.bridge, "link", "set", port, "master", "br0", "up")
		l.ip("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		l.ip("-n", ns, "link", "set", "eth0", "up")
		l.ip("-n", ns, "link", "set", "lo", "up")
	}
	l.nft(fmt.Sprintf("add table bridge %s\nadd chain bridge %s faults { type filter hook forward priority 0; policy accept; }\n", nftTable, nftTable))
	return l
}

// Addr is host's address.
func (l *netLab) Addr(host string) string { return l.addr[host] }

// Exec is the command line that runs argv in host's namespace.
func (l *netLab) Exec(host string, argv ...string) []string {
	return append([]string{"netns", "exec", l.ns[host]}, argv...)
}

// Drop adds nft rules, each a match in nft's syntax that drops what it matches (e.g.
// "ip saddr 10.77.0.4"), to the faults chain.
func (l *netLab) Drop(matches ...string) {
	l.t.Helper()
	var b strings.Builder
	for _, m := range matches {
		fmt.Fprintf(&b, "add rule bridge %s faults %s drop\n", nftTable, m)
	}
	l.nft(b.String())
}

// Heal deletes every fault rule and sets every relay's delay back to 0.
func (l *netLab) Heal() {
	l.t.Helper()
	l.nft(fmt.Sprintf("flush chain bridge %s faults\n", nftTable))
	for _, r := range l.relay {
		r.SetDelay(0)
	}
}

// Delay holds every frame host sends or receives for d (netRelay.SetDelay), from now until the
// next Delay or Heal; host must have been made withRelay.
func (l *netLab) Delay(host string, d time.Duration) {
	l.t.Helper()
	r := l.relay[host]
	if r == nil {
		l.t.Fatalf("netLab.Delay(%q): the host has no relay (newNetLab withRelay)", host)
	}
	r.SetDelay(d)
}

// Cut drops everything host sends or receives.
func (l *netLab) Cut(host string) []string {
	return []string{"ip saddr " + l.addr[host], "ip daddr " + l.addr[host]}
}

// CutBetween drops everything between hosts a and b, both ways.
func (l *netLab) CutBetween(a, b string) []string {
	return []string{l.OneWay(a, b), l.OneWay(b, a)}
}

// OneWay drops what host from sends to host to (not the replies).
func (l *netLab) OneWay(from, to string) string {
	return fmt.Sprintf("ip saddr %s ip daddr %s", l.addr[from], l.addr[to])
}

// Loss drops percent of the packets host sends and of those it receives, each at random.
func (l *netLab) Loss(host string, percent int) []string {
	return []string{
		fmt.Sprintf("ip saddr %s numgen random mod 100 < %d", l.addr[host], percent),
		fmt.Sprintf("ip daddr %s numgen random mod 100 < %d", l.addr[host], percent),
	}
}

// nft runs an nft script in the bridge namespace.
func (l *netLab) nft(script string) {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.bridge, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("nft in %s: %v\n%s\nscript:\n%s", l.bridge, err, out, script)
	}
}

func (l *netLab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// remove deletes the nft table and every namespace of the lab that exists (a veth goes with its
// namespace), and reports what it could not delete.
func (l *netLab) remove() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var left []string
	for _, line := range bytes.Split(out, []byte("\n")) {
		if f := strings.Fields(string(line)); len(f) > 0 && strings.HasPrefix(f[0], l.prefix+"-") {
			left = append(left, f[0])
		}
	}
	for _, ns := range left {
		if ns == l.bridge {
			_ = exec.Command("ip", "netns", "exec", ns, "nft", "delete", "table", "bridge", nftTable).Run()
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			l.t.Errorf("ip netns del %s: %v\n%s", ns, err, out)
		}
	}
}
