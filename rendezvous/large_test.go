package rendezvous_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// TestLargeValues: a small roster stays plain JSON, a large one is
// compressed, both read back equal; a value that is neither fails.
func TestLargeValues(t *testing.T) {
	small := rendezvous.Roster{Round: 1, Members: slurmMembers(3)}
	large := rendezvous.Roster{Round: 2, Members: slurmMembers(500)}
	for _, tc := range []struct {
		name  string
		r     rendezvous.Roster
		first byte
	}{
		{"3 nodes: plain JSON", small, '{'},
		{"500 nodes: gzip", large, 0x1f},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := tc.r.Encode()
			require.NoError(t, err)
			require.Equal(t, tc.first, data[0])
			got, err := rendezvous.DecodeRoster(data)
			require.NoError(t, err)
			require.Equal(t, tc.r, got)
		})
	}
	data, err := large.Encode()
	require.NoError(t, err)
	_, err = rendezvous.DecodeRoster(data[:len(data)/2])
	require.Error(t, err, "a truncated compressed value")
	_, err = rendezvous.DecodeRoster([]byte("not json"))
	require.Error(t, err)
}

// TestRoundOf20000NodesFitsOneRequest: the transaction that starts a
// round of 20000 nodes (state, roster, every placement bucket) is
// refused by etcd's default request limit as plain JSON, and fits as the
// protocol encodes it, which reads back equal.
func TestRoundOf20000NodesFitsOneRequest(t *testing.T) {
	for _, srv := range etcdtest.Kinds() {
		t.Run(srv.Name, func(t *testing.T) {
			client := etcdtest.NewClient(t, srv.Start(t).Endpoints()...)
			store, err := etcdstore.NewConn(client).NewStore(context.Background(), etcdstore.Incarnation{RunID: "big"}, testTTL)
			require.NoError(t, err)
			t.Cleanup(func() { _ = store.Close() })
			members := slurmMembers(20000)
			roster := rendezvous.Roster{Round: 1, Members: members}
			buckets := roster.Buckets(members)

			round := func(encode func(v any) ([]byte, error)) []rendezvous.KV {
				writes := []rendezvous.KV{{Key: rendezvous.KeyState, Value: []byte(`{"round":1}`)}}
				data, err := encode(roster)
				require.NoError(t, err)
				writes = append(writes, rendezvous.KV{Key: rendezvous.KeyRoster, Value: data})
				for b, bucket := range buckets {
					data, err := encode(bucket)
					require.NoError(t, err)
					writes = append(writes, rendezvous.KV{Key: rendezvous.Key{Kind: rendezvous.KindPlace, Bucket: b}.String(), Value: data})
				}
				return writes
			}
			plain := round(json.Marshal)
			_, err = store.Txn(context.Background(), "", 0, plain...)
			require.Error(t, err, "plain JSON: %d bytes", size(plain))
			require.Regexp(t, "too large|larger than max", err.Error(), "etcd's request limit, or the client's own")

			encoded := round(func(v any) ([]byte, error) {
				switch v := v.(type) {
				case rendezvous.Roster:
					return v.Encode()
				case rendezvous.Bucket:
					return v.Encode()
				}
				return nil, fmt.Errorf("%T", v)
			})
			_, err = store.Txn(context.Background(), "", 0, encoded...)
			require.NoError(t, err, "encoded: %d bytes", size(encoded))
			t.Logf("a round of %d nodes: %d bytes as JSON, %d as stored", len(members), size(plain), size(encoded))

			kvs, _, err := store.List(context.Background(), rendezvous.KeyRoster, 0)
			require.NoError(t, err)
			require.Len(t, kvs, 1)
			got, err := rendezvous.DecodeRoster(kvs[0].Value)
			require.NoError(t, err)
			require.Equal(t, roster, got)
		})
	}
}

func size(kvs []rendezvous.KV) int {
	n := 0
	for _, kv := range kvs {
		n += len(kv.Key) + len(kv.Value)
	}
	return n
}

// slurmMembers are n members with ids (host.pid), hosts, addresses, join
// orders and times as the agents of a SLURM job have them; the same for
// the same n.
func slurmMembers(n int) []rendezvous.Member {
	rnd := rand.New(rand.NewPCG(1, uint64(n)))
	since := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	out := make([]rendezvous.Member, n)
	for i := range out {
		host := fmt.Sprintf("nid%06d", i)
		out[i] = rendezvous.Member{ID: fmt.Sprintf("%s.%d", host, 1000+rnd.IntN(4_000_000)), Host: host,
			Addr: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), Preferred: i, NProc: 8,
			Order: int64(1000 + 3*i + rnd.IntN(3)), Since: since.Add(time.Duration(rnd.Int64N(int64(time.Minute)))), Port: 29500}
	}
	return out
}

// TestDecompressionBomb: a compressed value is refused before it is
// inflated when the size its trailer declares is over the cap or over
// 64 times the value (a 16 KB value of 16 MiB of spaces; a 260 KB one
// of 256 MiB took 1.5 s and over 512 MiB per decode), and after when it
// does not inflate to exactly that size; a roster as uniform as they
// come (10x) still reads back.
func TestDecompressionBomb(t *testing.T) {
	gz := func(data []byte) []byte {
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		require.NoError(t, err)
		_, err = zw.Write(data)
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		return buf.Bytes()
	}
	withSize := func(data []byte, size uint32) []byte {
		out := bytes.Clone(data)
		binary.LittleEndian.PutUint32(out[len(out)-4:], size)
		return out
	}
	roster, err := rendezvous.Roster{Round: 2, Members: slurmMembers(500)}.Encode()
	require.NoError(t, err)
	size := binary.LittleEndian.Uint32(roster[len(roster)-4:])
	bomb := gz(bytes.Repeat([]byte(" "), 16<<20))
	require.Less(t, len(bomb), 20<<10)

	for _, tc := range []struct {
		name, data, want string
	}{
		{"bomb", string(bomb), "declares 16777216 bytes inflated, over 64 times its size"},
		{"declares 4 GiB", string(withSize(roster, 1<<32-1)), "declares 4294967295 bytes inflated, over the 268435456 allowed"},
		{"declares less", string(withSize(roster, size-1)), "inflates past the"},
		{"declares more", string(withSize(roster, size+1)), "inflating the"},
		{"two streams", string(roster) + string(roster), "bytes after the gzip stream"},
		{"too short", "\x1f\x8b\x08", "too short for a gzip stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rendezvous.DecodeRoster([]byte(tc.data))
			require.ErrorContains(t, err, tc.want)
			_, err = rendezvous.DecodeBucket([]byte(tc.data))
			require.ErrorContains(t, err, tc.want)
		})
	}

	uniform := rendezvous.Roster{Round: 3, Members: make([]rendezvous.Member, 20000)}
	for i := range uniform.Members {
		host := fmt.Sprintf("n%d", i)
		uniform.Members[i] = rendezvous.Member{ID: host + ".1", Host: host, Addr: host, Preferred: -1, NProc: 1, Order: int64(i), Since: time.Unix(0, 0).UTC()}
	}
	data, err := uniform.Encode()
	require.NoError(t, err)
	got, err := rendezvous.DecodeRoster(data)
	require.NoError(t, err)
	require.Equal(t, uniform, got)
}
