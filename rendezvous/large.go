package rendezvous

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
)

// The values that grow with the job, the roster and the placement
// buckets, go out with the round's state in one transaction, which etcd
// bounds by its request limit (1.5 MiB by default): about 240 bytes a
// node as JSON, so some 6500 nodes. Once such a value is over
// compressAbove it is written gzip-compressed, about 5 times smaller with
// real host names, pids and addresses, which moves the bound past 30000
// nodes. A small job's values stay plain JSON, readable with etcdctl.
const compressAbove = 16 << 10

// maxInflated bounds what a compressed value may inflate to, so that a
// corrupt or hostile value cannot make an agent allocate without bound.
const maxInflated = 256 << 20

// gzipMagic starts every gzip stream; no JSON value starts with it.
var gzipMagic = []byte{0x1f, 0x8b}

// marshalLarge is v as JSON, gzip-compressed when over compressAbove.
func marshalLarge(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || len(data) <= compressAbove {
		return data, err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// unmarshalLarge decodes a value marshalLarge wrote, compressed or not,
// into v. It fails on a value that is neither, or inflates past
// maxInflated.
func unmarshalLarge(data []byte, v any) error {
	if !bytes.HasPrefix(data, gzipMagic) {
		return json.Unmarshal(data, v)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("rendezvous: compressed value: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxInflated+1))
	if err != nil {
		return fmt.Errorf("rendezvous: compressed value: %w", err)
	}
	if len(raw) > maxInflated {
		return fmt.Errorf("rendezvous: compressed value inflates past %d bytes", maxInflated)
	}
	return json.Unmarshal(raw, v)
}

// Encode is the roster as the protocol stores it (KeyRoster): JSON,
// gzip-compressed for a large job.
func (r Roster) Encode() ([]byte, error) { return marshalLarge(r) }

// DecodeRoster reads a roster as Roster.Encode wrote it.
func DecodeRoster(data []byte) (Roster, error) {
	var r Roster
	err := unmarshalLarge(data, &r)
	return r, err
}

// Encode is the bucket as the protocol stores it: JSON, gzip-compressed
// for a large job.
func (b Bucket) Encode() ([]byte, error) { return marshalLarge(b) }

// DecodeBucket reads a bucket as Bucket.Encode wrote it.
func DecodeBucket(data []byte) (Bucket, error) {
	var b Bucket
	err := unmarshalLarge(data, &b)
	return b, err
}
