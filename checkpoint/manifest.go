package checkpoint

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// FormatVersion is the manifest format this package writes and the newest it reads.
const FormatVersion = 1

// DTypeFloat32 is the only element type written so far: raw little-endian IEEE 754 binary32.
const DTypeFloat32 = "float32"

// DefaultBlockBytes is the checksum granularity: every chunk carries one crc32c per block of this
// many bytes, so a resharding load verifies what it reads without reading whole chunks.
const DefaultBlockBytes = 1 << 20

// MaxBlockBytes bounds the checksum block size, written or read: a reader holds one whole block
// in memory to verify it.
const MaxBlockBytes = maxReadBytes

// maxElements bounds a tensor's elements so that its size in bytes fits an int64.
const maxElements = math.MaxInt64 / elemBytes

// Manifest is the content of manifest.json: what a checkpoint holds and where every byte is.
type Manifest struct {
	Version     int       `json:"format_version"`
	Step        int64     `json:"step"`
	SampleIndex int64     `json:"sample_index"`
	RNG         []byte    `json:"rng,omitempty"`
	ConfigHash  string    `json:"config_hash,omitempty"`
	World       World     `json:"world"`
	Created     time.Time `json:"created"`
	// BlockBytes is the size of the blocks each chunk's checksums cover.
	BlockBytes int64        `json:"block_bytes"`
	Files      []FileMeta   `json:"files"`
	Tensors    []TensorMeta `json:"tensors"`
}

// FileMeta is one data file of a checkpoint and its exact size.
type FileMeta struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	Rank  int    `json:"rank"`
}

// TensorMeta is one named tensor: its global shape and the chunks that together cover each of
// its elements exactly once.
type TensorMeta struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Chunks []Chunk `json:"chunks"`
}

// Elements is the number of elements of the tensor (the product of its shape; 1 for a scalar).
func (t TensorMeta) Elements() int64 { return numel(t.Shape) }

// Chunk is a contiguous range of a tensor's flat elements stored in one file.
type Chunk struct {
	Offset     int64  `json:"offset"` // global element offset
	Length     int64  `json:"length"` // elements
	File       string `json:"file"`
	ByteOffset int64  `json:"byte_offset"`
	// CRC32C holds the crc32c (Castagnoli) of each BlockBytes block of the chunk's bytes; the last
	// block may be shorter.
	CRC32C []uint32 `json:"crc32c"`
}

// numel is the product of shape; validate has checked it does not overflow.
func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// CorruptError says that a checkpoint cannot be trusted: a checksum mismatch, a short or missing
// file, a manifest that does not describe every element exactly once. A loader falls back to the
// previous checkpoint on it.
type CorruptError struct {
	File   string // data file or manifest, relative to the step directory; may be empty
	Tensor string // may be empty
	Detail string
}

// Error names the file and tensor first: "shard-00001.bin tensor wte: crc32c mismatch ...".
func (e *CorruptError) Error() string {
	var parts []string
	if e.File != "" {
		parts = append(parts, e.File)
	}
	if e.Tensor != "" {
		parts = append(parts, "tensor "+e.Tensor)
	}
	if len(parts) == 0 {
		return e.Detail
	}
	return strings.Join(parts, " ") + ": " + e.Detail
}

func corrupt(file, tensor, format string, args ...any) *CorruptError {
	return &CorruptError{File: file, Tensor: tensor, Detail: fmt.Sprintf(format, args...)}
}

// ReadManifest reads and validates stepDir/manifest.json without opening the data files. A
// missing manifest is an fs.ErrNotExist error (the directory is not a checkpoint); an
// unparsable or inconsistent one is a *CorruptError.
func ReadManifest(stepDir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(stepDir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read manifest: %w", err)
	}
	return parseManifest(b)
}

// parseManifest decodes and validates the bytes of a manifest.json.
func parseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, corrupt(ManifestName, "", "not valid JSON: %v", err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// validate checks that the manifest is internally consistent: known version and dtypes, a
// step, sample index and layout a resume can use, chunks inside their tensors and files, one
// checksum per block, every element covered exactly once. Every sum and product of its numbers
// is checked before it is made, so a corrupt manifest is an error, never an overflow that
// passes (a chunk "inside" its file by wrapping around) or a panic later.
func (m *Manifest) validate() error {
	switch {
	case m.Version < 1 || m.Version > FormatVersion:
		return corrupt(ManifestName, "", "format_version %d, this gorun reads 1 to %d", m.Version, FormatVersion)
	case m.BlockBytes <= 0 || m.BlockBytes > MaxBlockBytes:
		return corrupt(ManifestName, "", "block_bytes %d must be between 1 and %d", m.BlockBytes, MaxBlockBytes)
	case m.Step < 0 || m.SampleIndex < 0:
		return corrupt(ManifestName, "", "step %d and sample_index %d must not be negative", m.Step, m.SampleIndex)
	}
	if err := m.World.Validate(); err != nil {
		return corrupt(ManifestName, "", "world: %v", err)
	}
	files := map[string]int64{}
	for _, f := range m.Files {
		if !validFileName(f.Name) {
			return corrupt(ManifestName, "", "bad data file name %q", f.Name)
		}
		if _, dup := files[f.Name]; dup || f.Bytes < 0 {
			return corrupt(ManifestName, "", "data file %q listed twice or with a negative size", f.Name)
		}
		files[f.Name] = f.Bytes
	}
	names := map[string]bool{}
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if t.Name == "" || names[t.Name] {
			return corrupt(ManifestName, t.Name, "tensor name empty or repeated")
		}
		names[t.Name] = true
		if err := m.validateTensor(t, files); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manifest) validateTensor(t *TensorMeta, files map[string]int64) error {
	if t.DType != DTypeFloat32 {
		return corrupt(ManifestName, t.Name, "dtype %q, want %q", t.DType, DTypeFloat32)
	}
	n := int64(1)
	for _, d := range t.Shape {
		switch {
		case d < 0:
			return corrupt(ManifestName, t.Name, "negative dimension in shape %v", t.Shape)
		case d > 0 && n > maxElements/d:
			return corrupt(ManifestName, t.Name, "shape %v has more than %d elements", t.Shape, int64(maxElements))
		}
		n *= d
	}
	for _, c := range t.Chunks {
		size, ok := files[c.File]
		// n <= maxElements and size >= 0: none of the differences below overflow, and
		// c.Length*elemBytes is computed only once c.Length <= n.
		switch {
		case !ok:
			return corrupt(ManifestName, t.Name, "chunk in unlisted file %q", c.File)
		case c.Offset < 0 || c.Length <= 0 || c.Length > n-c.Offset:
			return corrupt(c.File, t.Name, "chunk of %d elements at %d outside the tensor's %d elements", c.Length, c.Offset, n)
		case c.ByteOffset < 0 || c.ByteOffset > size-c.Length*elemBytes:
			return corrupt(c.File, t.Name, "chunk of %d bytes at byte %d outside the file's %d bytes", c.Length*elemBytes, c.ByteOffset, size)
		case int64(len(c.CRC32C)) != blocks(c.Length*elemBytes, m.BlockBytes):
			return corrupt(c.File, t.Name, "%d checksums for %d blocks", len(c.CRC32C), blocks(c.Length*elemBytes, m.BlockBytes))
		}
	}
	return coverage(t)
}

// coverage sorts t's chunks by offset and checks they tile [0, elements) exactly once.
func coverage(t *TensorMeta) error {
	slices.SortFunc(t.Chunks, func(a, b Chunk) int { return cmp.Compare(a.Offset, b.Offset) })
	next := int64(0)
	for _, c := range t.Chunks {
		switch {
		case c.Offset > next:
			return corrupt("", t.Name, "elements [%d, %d) are in no chunk", next, c.Offset)
		case c.Offset < next:
			return corrupt(c.File, t.Name, "elements [%d, %d) are in more than one chunk", c.Offset, min(next, c.Offset+c.Length))
		}
		next = c.Offset + c.Length
	}
	if n := t.Elements(); next != n {
		return corrupt("", t.Name, "elements [%d, %d) are in no chunk", next, n)
	}
	return nil
}

// blocks is the number of blockBytes blocks that n bytes take, the last one partial.
func blocks(n, blockBytes int64) int64 {
	b := n / blockBytes
	if n%blockBytes != 0 {
		b++
	}
	return b
}

func validFileName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, `/\`) && name != ManifestName
}
