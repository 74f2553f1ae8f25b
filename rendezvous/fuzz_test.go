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
