package rendezvous

import (
	"cmp"
	"encoding/json"
	"slices"
)

// The keys of an incarnation, relative to its prefix, as the protocol
// writes them: for code that manages or reads a job's keys outside the
// protocol (the etcd store, gorun status).
const (
	KeyState    = keyState    // the round's State, changed by compare-and-swap
	KeyRoster   = keyRoster   // the Roster of the last round that froze
	PrefixPlace = prefixPlace // PlaceBuckets keys: the Bucket of each
	PrefixNodes = prefixNodes // one leased Member per registered agent
	PrefixWait  = prefixWait  // one leased Member per agent waiting for the next round
	PrefixFail  = prefixFail  // the failure reports, unleased
	PrefixKept  = prefixKept  // the in-place recoveries, one unleased key each
)

// DecodeRecoveries returns the in-place recoveries among kvs (keys under
// PrefixKept), in round order; a value that is not one is left out.
func DecodeRecoveries(kvs []KV) []Recovery {
	var out []Recovery
	for _, kv := range kvs {
		var r Recovery
		if json.Unmarshal(kv.Value, &r) == nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Recovery) int { return cmp.Compare(a.Round, b.Round) })
	return out
}

// DecodeFailures returns the failure reports among kvs (keys under
// PrefixFail), each with its Revision, in causal order (OrderFailures);
// a value that is not a report is left out.
func DecodeFailures(kvs []KV) []Failure { return decodeFailures(kvs) }
