package rendezvous

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
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

// maxRatio bounds how many times its own size a compressed value may
// inflate to. Deflate reaches ~1000x, so without it a 260 KB value (well
// inside etcd's request limit) inflates to maxInflated: 1.5 s and over
// 512 MiB on every agent, at every event. Rosters and buckets compress
// 5-6x with real names and addresses, 10x when every field is uniform:
// 64 leaves room, and a value of etcd's 1.5 MiB still reads up to 96 MiB
// (400000 nodes).
const maxRatio = 64

// gzipMinLen is the shortest gzip stream: a 10-byte header, an empty
// deflate block (2 bytes) and the 8-byte trailer.
const gzipMinLen = 20

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
// into v. It fails on a value that is neither, or that inflate refuses.
func unmarshalLarge(data []byte, v any) error {
	if !bytes.HasPrefix(data, gzipMagic) {
		return json.Unmarshal(data, v)
	}
	raw, err := inflate(data)
	if err != nil {
		return fmt.Errorf("rendezvous: compressed value of %d bytes: %w", len(data), err)
	}
	return json.Unmarshal(raw, v)
}

// inflate returns what the one gzip stream data holds inflates to. The
// size the stream declares (its trailer's ISIZE, exact for what
// marshalLarge writes) is checked before anything is inflated: it must
// be at most maxInflated and maxRatio times len(data). Then exactly that
// many bytes are inflated into a buffer of that size; a stream that
// inflates to more or less, fails its checksum, or is followed by more
// bytes (a second stream) is refused.
func inflate(data []byte) ([]byte, error) {
	if len(data) < gzipMinLen {
		return nil, errors.New("too short for a gzip stream")
	}
	declared := int64(binary.LittleEndian.Uint32(data[len(data)-4:]))
	switch {
	case declared > maxInflated:
		return nil, fmt.Errorf("declares %d bytes inflated, over the %d allowed", declared, maxInflated)
	case declared > maxRatio*int64(len(data)):
		return nil, fmt.Errorf("declares %d bytes inflated, over %d times its size", declared, maxRatio)
	}
	in := bytes.NewReader(data)
	zr, err := gzip.NewReader(in)
	if err != nil {
		return nil, err
	}
	zr.Multistream(false)
	raw := make([]byte, declared)
	if _, err := io.ReadFull(zr, raw); err != nil {
		return nil, fmt.Errorf("inflating the %d bytes it declares: %w", declared, err)
	}
	// The stream must end here: the next read checks its CRC-32 and size.
	var one [1]byte
	switch _, err := io.ReadAtLeast(zr, one[:], 1); {
	case err == nil:
		return nil, fmt.Errorf("inflates past the %d bytes it declares", declared)
	case !errors.Is(err, io.EOF):
		return nil, err
	case in.Len() > 0:
		return nil, fmt.Errorf("%d bytes after the gzip stream", in.Len())
	}
	return raw, nil
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
