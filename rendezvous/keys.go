package rendezvous

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The keys of a job, relative to its incarnation's prefix. This file is
// their one owner: every key is built by Key.String (or the constants
// here) and read back by ParseKey and Decode, in the protocol, the etcd
// store, gorun status and the tests alike.
const (
	KeyState      = "state"     // the round's State, changed by compare-and-swap; every agent watches it
	KeyLeader     = "leader"    // the aggregator's id, under its lease
	KeyRoster     = "roster"    // the Roster of the last round that froze
	PrefixPlace   = "place/"    // place/<bucket>: the Bucket of placements, each watched by its nodes only
	PrefixNodes   = "nodes/"    // nodes/<id>: Member, leased: the node's liveness
	PrefixWait    = "waiting/"  // waiting/<id>: Member, leased: a node waiting for a round
	PrefixRounds  = "rounds/"   // rounds/<round>/<join|done|stall|unreach|exchange>/<id>: one round's keys, leased
	PrefixFail    = "failures/" // failures/<round>/<class>-...: Failure, unleased (see failureKey)
	PrefixKept    = "inplace/"  // inplace/<round>: Recovery, unleased: one per in-place recovery
	PrefixStats   = "stats/"    // stats/<id>: the node's straggler.Report, leased, rewritten every few seconds
	PrefixGoodput = "goodput/"  // goodput/<id>: the node's goodput.NodeReport, unleased, so a finished job's figures stay
)

// Kind is what a key of a job holds; each kind has one shape (Key.String)
// and one value type (Decode).
type Kind int

// The kinds of key, each with its shape and what Decode returns for it.
const (
	KindUnknown  Kind = iota // not a key of the job's schema
	KindState                // KeyState: State
	KindLeader               // KeyLeader: the aggregator's id (string)
	KindRoster               // KeyRoster: Roster
	KindPlace                // place/<Bucket, 2 digits>: Bucket
	KindNode                 // nodes/<ID>: Member
	KindWaiting              // waiting/<ID>: Member
	KindJoin                 // rounds/<Round, 8 digits>/join/<ID>: Member
	KindDone                 // rounds/<Round>/done/<ID>: the node's host (string)
	KindStall                // rounds/<Round>/stall/<ID>: the node's host (string)
	KindUnreach              // rounds/<Round>/unreach/<ID>: the ids the node cannot reach ([]string)
	KindFailure              // failures/<Round, 8 digits>/0-node-<ID>, 0-agent-<ID> or <Class>-<Rank, 8 digits>: Failure
	KindKept                 // inplace/<Round, 8 digits>: Recovery
	KindStats                // stats/<ID>: the raw value ([]byte), for package straggler
	KindGoodput              // goodput/<ID>: the raw value ([]byte), for package goodput
	KindExchange             // rounds/<Round>/exchange/<ID>: Exchanged, the node's part of Elastic.Exchange
)

var kindNames = [...]string{"unknown", "state", "leader", "roster", "place", "node", "waiting", "join", "done", "stall", "unreach", "failure", "inplace", "stats", "goodput", "exchange"}

// String is the kind's name, as in the key shapes above.
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "Kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// roundKinds are the kinds under PrefixRounds, by the name in their key.
var roundKinds = map[string]Kind{"join": KindJoin, "done": KindDone, "stall": KindStall, "unreach": KindUnreach, "exchange": KindExchange}

// Key is one key of a job as a value: its kind and the fields its shape
// holds (the others are zero).
type Key struct {
	Kind   Kind
	Round  int    // round keys, failures, in-place recoveries
	Bucket int    // placement buckets
	ID     string // the node of a node, waiting, round, stats or goodput key, or of a node's or agent's failure
	// A failure's class: 0 a lost node (ID set, Agent false) or a failed
	// agent (ID set, Agent true), 1 a worker that failed on its own, 2 a
	// worker that names a lost peer (Rank set). See failureKey.
	Class int
	Rank  int  // a worker's failure: its global rank
	Agent bool // a class-0 failure of the node's agent, not of the node
}

// String is the key k names, relative to the job's prefix; ParseKey reads
// it back. A Key of KindUnknown is "".
func (k Key) String() string {
	switch k.Kind {
	case KindState:
		return KeyState
	case KindLeader:
		return KeyLeader
	case KindRoster:
		return KeyRoster
	case KindPlace:
		return fmt.Sprintf("%s%02d", PrefixPlace, k.Bucket)
	case KindNode:
		return PrefixNodes + k.ID
	case KindWaiting:
		return PrefixWait + k.ID
	case KindJoin, KindDone, KindStall, KindUnreach, KindExchange:
		return roundPrefix(k.Round) + k.Kind.String() + "/" + k.ID
	case KindFailure:
		head := fmt.Sprintf("%s%08d/", PrefixFail, k.Round)
		switch {
		case k.Class == 0 && k.Agent:
			return head + "0-agent-" + k.ID
		case k.Class == 0:
			return head + "0-node-" + k.ID
		}
		return head + fmt.Sprintf("%d-%08d", k.Class, k.Rank)
	case KindKept:
		return fmt.Sprintf("%s%08d", PrefixKept, k.Round)
	case KindStats:
		return PrefixStats + k.ID
	case KindGoodput:
		return PrefixGoodput + k.ID
	}
	return ""
}

// ParseKey reads a key of the job (relative to its prefix) as Key.String
// writes it; false for a key of no kind, or of a kind but malformed.
func ParseKey(key string) (Key, bool) {
	switch key {
	case KeyState:
		return Key{Kind: KindState}, true
	case KeyLeader:
		return Key{Kind: KindLeader}, true
	case KeyRoster:
		return Key{Kind: KindRoster}, true
	}
	prefix, rest, _ := strings.Cut(key, "/")
	prefix += "/"
	switch prefix {
	case PrefixPlace:
		b, err := strconv.Atoi(rest)
		return Key{Kind: KindPlace, Bucket: b}, err == nil
	case PrefixNodes:
		return Key{Kind: KindNode, ID: rest}, true
	case PrefixWait:
		return Key{Kind: KindWaiting, ID: rest}, true
	case PrefixStats:
		return Key{Kind: KindStats, ID: rest}, true
	case PrefixGoodput:
		return Key{Kind: KindGoodput, ID: rest}, true
	case PrefixKept:
		r, err := strconv.Atoi(rest)
		return Key{Kind: KindKept, Round: r}, err == nil
	case PrefixRounds:
		r, tail, _ := strings.Cut(rest, "/")
		name, id, _ := strings.Cut(tail, "/")
		round, err := strconv.Atoi(r)
		kind, ok := roundKinds[name]
		return Key{Kind: kind, Round: round, ID: id}, ok && err == nil
	case PrefixFail:
		r, tail, _ := strings.Cut(rest, "/")
		round, err := strconv.Atoi(r)
		if err != nil {
			return Key{}, false
		}
		k := Key{Kind: KindFailure, Round: round}
		if id, ok := strings.CutPrefix(tail, "0-node-"); ok {
			k.ID = id
			return k, true
		}
		if id, ok := strings.CutPrefix(tail, "0-agent-"); ok {
			k.ID, k.Agent = id, true
			return k, true
		}
		class, rank, _ := strings.Cut(tail, "-")
		var cerr, rerr error
		k.Class, cerr = strconv.Atoi(class)
		k.Rank, rerr = strconv.Atoi(rank)
		return k, cerr == nil && rerr == nil && k.Class > 0
	}
	return Key{}, false
}

// Decode decodes kv's value as a key of k's kind holds it (see Kind): a
// State, Roster, Bucket, Member, Failure (Revision set to the revision
// that created kv), Recovery, []string, a string, or the raw []byte. It
// fails on a value that is not of its kind's type, or a key of no kind.
func Decode(k Key, kv KV) (any, error) {
	switch k.Kind {
	case KindState:
		return decodeJSON[State](kv.Value)
	case KindRoster:
		return DecodeRoster(kv.Value)
	case KindPlace:
		return DecodeBucket(kv.Value)
	case KindNode, KindWaiting, KindJoin:
		return decodeJSON[Member](kv.Value)
	case KindUnreach:
		return decodeJSON[[]string](kv.Value)
	case KindFailure:
		f, err := decodeJSON[Failure](kv.Value)
		f.Revision = kv.Create
		return f, err
	case KindKept:
		return decodeJSON[Recovery](kv.Value)
	case KindExchange:
		return decodeJSON[Exchanged](kv.Value)
	case KindLeader, KindDone, KindStall:
		return string(kv.Value), nil
	case KindStats, KindGoodput:
		return kv.Value, nil
	}
	return nil, fmt.Errorf("rendezvous: key %q: no kind of the job's keys", kv.Key)
}

func decodeJSON[T any](data []byte) (T, error) {
	var v T
	err := json.Unmarshal(data, &v)
	return v, err
}

// The keys the protocol writes, each built from its Key.

func placeKey(bucket int) string { return Key{Kind: KindPlace, Bucket: bucket}.String() }
func nodeKey(id string) string   { return Key{Kind: KindNode, ID: id}.String() }
func waitKey(id string) string   { return Key{Kind: KindWaiting, ID: id}.String() }
func keptKey(round int) string   { return Key{Kind: KindKept, Round: round}.String() }

func roundPrefix(round int) string { return fmt.Sprintf("%s%08d/", PrefixRounds, round) }

// joinPrefix is where the join keys of round are (joinKey).
func joinPrefix(round int) string { return roundPrefix(round) + KindJoin.String() + "/" }
func joinKey(round int, id string) string {
	return Key{Kind: KindJoin, Round: round, ID: id}.String()
}
func doneKey(round int, id string) string {
	return Key{Kind: KindDone, Round: round, ID: id}.String()
}
func stallKey(round int, id string) string {
	return Key{Kind: KindStall, Round: round, ID: id}.String()
}
func unreachKey(round int, id string) string {
	return Key{Kind: KindUnreach, Round: round, ID: id}.String()
}
func exchangeKey(round int, id string) string {
	return Key{Kind: KindExchange, Round: round, ID: id}.String()
}

// exchangePrefix is where the exchange keys of round are (exchangeKey).
func exchangePrefix(round int) string { return roundPrefix(round) + KindExchange.String() + "/" }

// failureKey is where failure f of a worker in round is kept; a later
// report of the same worker overwrites it and keeps its first revision.
// Keys sort roughly in OrderFailures' order — round, then lost nodes and
// failed agents (0-, nodeFailureKey and agentFailureKey), workers that
// failed on their own (1-), workers that name a lost peer (2-, the bulk
// when a node dies in a large job) — so that the first MaxListedFailures
// keys hold the first failures.
func failureKey(round int, f Failure) string {
	class := 1
	if f.LostPeer != nil && *f.LostPeer != f.Rank {
		class = 2
	}
	return Key{Kind: KindFailure, Round: round, Class: class, Rank: f.Rank}.String()
}

// nodeFailureKey is where the failure of node id in round is kept: it was
// lost, left out or evicted.
func nodeFailureKey(round int, id string) string {
	return Key{Kind: KindFailure, Round: round, ID: id}.String()
}

// agentFailureKey is where the failure of node id's agent in round is
// kept (Abandon).
func agentFailureKey(round int, id string) string {
	return Key{Kind: KindFailure, Round: round, ID: id, Agent: true}.String()
}

// StatsKey is where node id keeps its straggler report.
func StatsKey(id string) string { return Key{Kind: KindStats, ID: id}.String() }

// GoodputKey is where node id keeps its goodput figures.
func GoodputKey(id string) string { return Key{Kind: KindGoodput, ID: id}.String() }

// DecodeRecoveries returns the in-place recoveries among kvs (keys under
// PrefixKept), in round order; a value that is not one is left out.
func DecodeRecoveries(kvs []KV) []Recovery {
	var out []Recovery
	for _, kv := range kvs {
		if r, err := decodeJSON[Recovery](kv.Value); err == nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Recovery) int { return cmp.Compare(a.Round, b.Round) })
	return out
}

// DecodeFailures returns the failure reports among kvs (keys under
// PrefixFail), each with its Revision, in causal order (OrderFailures);
// a value that is not a report is left out.
func DecodeFailures(kvs []KV) []Failure {
	var out []Failure
	for _, kv := range kvs {
		if f, err := Decode(Key{Kind: KindFailure}, kv); err == nil {
			out = append(out, f.(Failure))
		}
	}
	OrderFailures(out)
	return out
}
