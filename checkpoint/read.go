package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
)

// maxReadBytes bounds one pread of whole blocks, and the buffer Verify reads into.
const maxReadBytes = 16 << 20

// Checkpoint is one opened step directory: its manifest and its open data files. Read and Verify
// are safe for concurrent use.
type Checkpoint struct {
	dir       string
	m         *Manifest
	files     map[string]*os.File
	tensors   map[string]*TensorMeta
	table     *crc32.Table
	bytesRead atomic.Int64
}

// Open reads and validates stepDir's manifest and opens its data files, checking each one's
// size. A directory without a manifest is not a checkpoint (an fs.ErrNotExist error); anything
// inconsistent is a *CorruptError.
func Open(stepDir string) (*Checkpoint, error) {
	m, err := ReadManifest(stepDir)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{dir: stepDir, m: m, files: map[string]*os.File{}, tensors: map[string]*TensorMeta{},
		table: crc32.MakeTable(crc32.Castagnoli)}
	for i := range m.Tensors {
		c.tensors[m.Tensors[i].Name] = &m.Tensors[i]
	}
	for _, fm := range m.Files {
		f, err := os.Open(filepath.Join(stepDir, fm.Name))
		if err != nil {
			c.Close()
			return nil, corrupt(fm.Name, "", "cannot open: %v", err)
		}
		c.files[fm.Name] = f
		st, err := f.Stat()
		if err != nil {
			c.Close()
			return nil, corrupt(fm.Name, "", "cannot stat: %v", err)
		}
		if st.Size() != fm.Bytes {
			c.Close()
			return nil, corrupt(fm.Name, "", "%d bytes, the manifest says %d", st.Size(), fm.Bytes)
		}
	}
	return c, nil
}

// Manifest returns the checkpoint's manifest; callers must not modify it.
func (c *Checkpoint) Manifest() *Manifest { return c.m }

// Dir is the step directory the checkpoint was opened from.
func (c *Checkpoint) Dir() string { return c.dir }

// BytesRead is the number of data bytes read so far (checksummed blocks included).
func (c *Checkpoint) BytesRead() int64 { return c.bytesRead.Load() }

// Close closes the data files.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files = nil
	return errors.Join(errs...)
}

// RequestError says that a read asked for something the checkpoint does not hold (an unknown
// tensor, a range past its end): a mismatch between the caller and the checkpoint, not damage.
type RequestError struct {
	Tensor string
	Detail string
}

// Error names the tensor and what was wrong with the request.
func (e *RequestError) Error() string { return "checkpoint: tensor " + e.Tensor + ": " + e.Detail }

// Read fills dst with the elements [offset, offset+len(dst)) of the named tensor. It reads only
// the checksum blocks that overlap that range (pread), verifies each, and returns a
// *CorruptError naming the file and tensor on a mismatch or short read, or a *RequestError if
// the tensor or range is not in the checkpoint. On error dst may be partly written.
func (c *Checkpoint) Read(name string, offset int64, dst []float32) error {
	t, ok := c.tensors[name]
	if !ok {
		return &RequestError{Tensor: name, Detail: "not in the checkpoint"}
	}
	n := int64(len(dst))
	if offset < 0 || n > t.Elements()-offset {
		return &RequestError{Tensor: name, Detail: fmt.Sprintf("range [%d, %d) outside its %d elements (shape %v)", offset, offset+n, t.Elements(), t.Shape)}
	}
	end := offset + n
	// The first chunk that ends after offset.
	i := sort.Search(len(t.Chunks), func(i int) bool { return t.Chunks[i].Offset+t.Chunks[i].Length > offset })
	out := asBytes(dst)
	for ; i < len(t.Chunks) && t.Chunks[i].Offset < end; i++ {
		ch := &t.Chunks[i]
		lo, hi := max(offset, ch.Offset), min(end, ch.Offset+ch.Length)
		part := out[(lo-offset)*elemBytes : (hi-offset)*elemBytes]
		if err := c.readChunk(t.Name, ch, (lo-ch.Offset)*elemBytes, (hi-ch.Offset)*elemBytes, part); err != nil {
			return err
		}
	}
	fromFile(out)
	return nil
}

// readChunk reads the bytes [rlo, rhi) of chunk ch into dst, reading and verifying the whole
// checksum blocks they overlap: whole blocks straight into dst, the partial first and last
// block through a scratch buffer.
func (c *Checkpoint) readChunk(tensor string, ch *Chunk, rlo, rhi int64, dst []byte) error {
	f := c.files[ch.File]
	bb := c.m.BlockBytes
	size := ch.Length * elemBytes
	var scratch []byte
	for pos := rlo; pos < rhi; {
		b := pos / bb
		bs, be := b*bb, min(b*bb+bb, size)
		if bs >= rlo && be <= rhi { // a run of whole blocks
			e := be
			for e < rhi && min(e+bb, size) <= rhi && e-bs+bb <= maxReadBytes {
				e = min(e+bb, size)
			}
			buf := dst[bs-rlo : e-rlo]
			if err := c.pread(f, tensor, ch, buf, bs); err != nil {
				return err
			}
			for k := int64(0); k*bb < int64(len(buf)); k++ {
				if err := c.check(tensor, ch, b+k, buf[k*bb:min((k+1)*bb, int64(len(buf)))]); err != nil {
					return err
				}
			}
			pos = e
			continue
		}
		if scratch == nil {
			scratch = make([]byte, min(bb, size))
		}
		buf := scratch[:be-bs]
		if err := c.pread(f, tensor, ch, buf, bs); err != nil {
			return err
		}
		if err := c.check(tensor, ch, b, buf); err != nil {
			return err
		}
		lo, hi := max(bs, rlo), min(be, rhi)
		copy(dst[lo-rlo:hi-rlo], buf[lo-bs:hi-bs])
		pos = hi
	}
	return nil
}

// pread reads buf from the chunk's bytes at chunk-relative offset off.
func (c *Checkpoint) pread(f *os.File, tensor string, ch *Chunk, buf []byte, off int64) error {
	n, err := f.ReadAt(buf, ch.ByteOffset+off)
	c.bytesRead.Add(int64(n))
	if errors.Is(err, io.EOF) {
		return corrupt(ch.File, tensor, "short read at byte %d: the file ends early", ch.ByteOffset+off+int64(n))
	}
	if err != nil {
		return corrupt(ch.File, tensor, "read bytes [%d, %d): %v", ch.ByteOffset+off, ch.ByteOffset+off+int64(len(buf)), err)
	}
	return nil
}

// check verifies block b of chunk ch.
func (c *Checkpoint) check(tensor string, ch *Chunk, b int64, data []byte) error {
	if got := crc32.Checksum(data, c.table); got != ch.CRC32C[b] {
		start := ch.ByteOffset + b*c.m.BlockBytes
		return corrupt(ch.File, tensor, "crc32c mismatch in file bytes [%d, %d) (elements [%d, %d)): stored %08x, computed %08x",
			start, start+int64(len(data)), ch.Offset+b*c.m.BlockBytes/elemBytes, ch.Offset+(b*c.m.BlockBytes+int64(len(data)))/elemBytes,
			ch.CRC32C[b], got)
	}
	return nil
}

// Verify reads every chunk of every tensor and checks every checksum (the manifest's coverage
// of every element exactly once and the file sizes were checked by Open). It returns nil, or
// every problem found joined (each a *CorruptError), or ctx's error.
func (c *Checkpoint) Verify(ctx context.Context) error {
	var errs []error
	buf := make([]byte, 0, maxReadBytes)
	for _, t := range c.m.Tensors {
	chunks:
		for ci := range t.Chunks {
			ch := &t.Chunks[ci]
			size := ch.Length * elemBytes
			per := max(maxReadBytes/c.m.BlockBytes, 1) * c.m.BlockBytes
			for off := int64(0); off < size; off += per {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("checkpoint: verify %s: %w", c.dir, err)
				}
				end := min(off+per, size)
				if int64(cap(buf)) < end-off {
					buf = make([]byte, 0, end-off)
				}
				b := buf[:end-off]
				if err := c.pread(c.files[ch.File], t.Name, ch, b, off); err != nil {
					errs = append(errs, err)
					continue chunks
				}
				for k := int64(0); k*c.m.BlockBytes < int64(len(b)); k++ {
					blk := b[k*c.m.BlockBytes : min((k+1)*c.m.BlockBytes, int64(len(b)))]
					if err := c.check(t.Name, ch, off/c.m.BlockBytes+k, blk); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}
