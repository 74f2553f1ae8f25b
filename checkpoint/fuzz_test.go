package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"hash/crc32"
	"math/big"
	"os"
	"path/filepath"
	"testing"
)

// fuzzDataLimit bounds the data files FuzzManifest writes to read a valid manifest back.
const fuzzDataLimit = 1 << 16

// FuzzManifest feeds manifest.json contents to the decoder and validator a load uses: any
// input is a *CorruptError or a manifest whose every chunk really lies inside its tensor and
// its file (checked here without overflow), never a panic; a small valid one is then opened,
// verified and read in full from zero-filled data files without a panic.
func FuzzManifest(f *testing.F) {
	crc := crc32.MakeTable(crc32.Castagnoli)
	zeros := func(n int) uint32 { return crc32.Checksum(make([]byte, n), crc) }
	seeds := []Manifest{
		{Version: 1, BlockBytes: 8, World: World{Replicas: 1, Shards: 1}, Files: []FileMeta{{Name: "shard-00000.bin", Bytes: 40}},
			Tensors: []TensorMeta{{Name: "w", DType: DTypeFloat32, Shape: []int64{2, 5}, Chunks: []Chunk{
				{Offset: 0, Length: 4, File: "shard-00000.bin", CRC32C: []uint32{zeros(8), zeros(8)}},
				{Offset: 4, Length: 6, File: "shard-00000.bin", ByteOffset: 16, CRC32C: []uint32{zeros(8), zeros(8), zeros(8)}},
			}}}},
		{Version: 1, Step: 200, SampleIndex: 6400, RNG: []byte{1, 2, 3}, ConfigHash: "abc", BlockBytes: DefaultBlockBytes,
			World: World{Replicas: 2, Shards: 2, Mode: "hsdp"},
			Files: []FileMeta{{Name: "shard-00000.bin", Bytes: 12}, {Name: "shard-00001.bin", Bytes: 8}},
			Tensors: []TensorMeta{
				{Name: "a", DType: DTypeFloat32, Shape: []int64{3}, Chunks: []Chunk{
					{Offset: 0, Length: 2, File: "shard-00000.bin", CRC32C: []uint32{zeros(8)}},
					{Offset: 2, Length: 1, File: "shard-00001.bin", CRC32C: []uint32{zeros(4)}},
				}},
				{Name: "scalar", DType: DTypeFloat32, Chunks: []Chunk{
					{Offset: 0, Length: 1, File: "shard-00000.bin", ByteOffset: 8, CRC32C: []uint32{zeros(4)}},
				}},
				{Name: "empty", DType: DTypeFloat32, Shape: []int64{0, 7}},
			}},
	}
	for _, m := range seeds {
		b, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "{", "null", `{"format_version":1}`,
		// Sums that wrap around an int64: a chunk "inside" its tensor or file.
		`{"format_version":1,"block_bytes":8,"world":{"replicas":1,"shards":1},"files":[{"name":"f","bytes":40}],` +
			`"tensors":[{"name":"w","dtype":"float32","shape":[10],"chunks":[{"offset":0,"length":10,"file":"f","byte_offset":9223372036854775800,"crc32c":[0,0,0,0,0]}]}]}`,
		`{"format_version":1,"block_bytes":8,"world":{"replicas":1,"shards":1},"files":[{"name":"f","bytes":40}],` +
			`"tensors":[{"name":"w","dtype":"float32","shape":[4294967296,4294967296],"chunks":[{"offset":0,"length":2,"file":"f","crc32c":[0]}]}]}`,
		`{"format_version":1,"block_bytes":9223372036854775807,"world":{"replicas":1,"shards":1},"files":[{"name":"f","bytes":40}],` +
			`"tensors":[{"name":"w","dtype":"float32","shape":[10],"chunks":[{"offset":0,"length":10,"file":"f","crc32c":[0]}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b)
		if err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is no *CorruptError: %v", err, err)
			}
			return
		}
		sizes := map[string]int64{}
		var total int64
		for _, fm := range m.Files {
			sizes[fm.Name] = fm.Bytes
			total += fm.Bytes
		}
		for _, tm := range m.Tensors {
			n := big.NewInt(1)
			for _, d := range tm.Shape {
				n.Mul(n, big.NewInt(d))
			}
			for _, c := range tm.Chunks {
				end := new(big.Int).Add(big.NewInt(c.Offset), big.NewInt(c.Length))
				if end.Cmp(n) > 0 {
					t.Fatalf("tensor %s: chunk [%d, +%d) past its %v elements", tm.Name, c.Offset, c.Length, n)
				}
				bytesEnd := new(big.Int).Mul(big.NewInt(c.Length), big.NewInt(elemBytes))
				bytesEnd.Add(bytesEnd, big.NewInt(c.ByteOffset))
				if bytesEnd.Cmp(big.NewInt(sizes[c.File])) > 0 {
					t.Fatalf("tensor %s: chunk bytes [%d, %v) past file %s's %d", tm.Name, c.ByteOffset, bytesEnd, c.File, sizes[c.File])
				}
			}
		}
		if total > fuzzDataLimit {
			return
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ManifestName), b, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, fm := range m.Files {
			if err := os.WriteFile(filepath.Join(dir, fm.Name), make([]byte, fm.Bytes), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ck, err := Open(dir)
		if err != nil {
			t.Fatalf("Open of a valid manifest with its files: %v", err)
		}
		defer ck.Close()
		_ = ck.Verify(context.Background())
		for _, tm := range m.Tensors {
			dst := make([]float32, tm.Elements())
			if err := ck.Read(tm.Name, 0, dst); err != nil {
				var ce *CorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("Read %s: %T is no *CorruptError: %v", tm.Name, err, err)
				}
			}
		}
	})
}
