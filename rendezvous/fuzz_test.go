package rendezvous_test

import (
	"testing"

	"github.com/gorun/gorun/rendezvous"
)

// FuzzDecodeLargeValues: any stored roster or bucket value, plain JSON
// or gzip, decodes or fails, never a panic; a roster that decodes
// encodes again.
func FuzzDecodeLargeValues(f *testing.F) {
	small, err := rendezvous.Roster{Round: 1, Members: slurmMembers(3)}.Encode()
	if err != nil {
		f.Fatal(err)
	}
	large, err := rendezvous.Roster{Round: 2, Members: slurmMembers(500)}.Encode()
	if err != nil {
		f.Fatal(err)
	}
	for _, b := range [][]byte{small, large, large[:len(large)/2], []byte("not json"), {0x1f, 0x8b}, []byte(`{"round":-1,"members":null}`), nil} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := rendezvous.DecodeRoster(data); err == nil {
			if _, err := r.Encode(); err != nil {
				t.Fatalf("a decoded roster does not encode: %v", err)
			}
		}
		_, _ = rendezvous.DecodeBucket(data)
	})
}

// FuzzParseKey: any key parses or not, never a panic; a key that parses
// is written back as it was read, unless it spelled a number another way
// (leading zeros, a sign): then the key it writes parses to the same Key.
func FuzzParseKey(f *testing.F) {
	for _, key := range []string{"state", "place/03", "nodes/a", "rounds/00000004/join/a", "failures/00000005/0-node-a",
		"failures/00000005/0-agent-a", "failures/00000005/2-00000012", "inplace/00000006", "stats/a", "goodput/a", "rounds/1"} {
		f.Add(key)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, ok := rendezvous.ParseKey(key)
		if !ok {
			return
		}
		again, ok := rendezvous.ParseKey(k.String())
		if !ok || again != k {
			t.Fatalf("%q parses to %+v, written %q, which parses to %+v (%v)", key, k, k.String(), again, ok)
		}
	})
}
