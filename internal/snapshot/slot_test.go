package snapshot

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

// encode builds a complete slot file of step and payload, as the Python
// package writes one.
func encode(step uint64, payload []byte) []byte {
	b := make([]byte, HeaderSize+len(payload))
	le := binary.LittleEndian
	copy(b, Magic)
	le.PutUint32(b[8:], Version)
	le.PutUint32(b[12:], HeaderSize)
	le.PutUint64(b[16:], step)
	le.PutUint64(b[24:], uint64(len(payload)))
	le.PutUint32(b[32:], crc32.Checksum(payload, castagnoli))
	le.PutUint32(b[headerCRC:], crc32.Checksum(b[:headerCRC], castagnoli))
	copy(b[HeaderSize:], payload)
	return b
}

// with returns a copy of b changed by f.
func with(b []byte, f func([]byte) []byte) []byte {
	return f(append([]byte(nil), b...))
}

func TestParse(t *testing.T) {
	payload := []byte("the state of rank 0 at step 42")
	good := encode(42, payload)
	tests := []struct {
		name string
		file []byte
		want error // nil: Slot{42, payload}
	}{
		{"complete", good, nil},
		{"trailing bytes after the payload (a slot sized for a larger state)", append(append([]byte(nil), good...), 0, 0, 0), nil},
		{"empty file", nil, ErrIncomplete},
		{"zeroed header (a save in progress)", with(good, func(b []byte) []byte { clear(b[:headerLen]); return b }), ErrIncomplete},
		{"torn header: the step written, not its CRC", with(good, func(b []byte) []byte { b[16]++; return b }), ErrIncomplete},
		{"torn header: the magic half written", with(good, func(b []byte) []byte { clear(b[4:8]); return b }), ErrIncomplete},
		{"another version", with(encode(42, payload), func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], 2)
			binary.LittleEndian.PutUint32(b[headerCRC:], crc32.Checksum(b[:headerCRC], castagnoli))
			return b
		}), ErrIncomplete},
		{"bad payload CRC", with(good, func(b []byte) []byte { b[HeaderSize+3] ^= 1; return b }), ErrCorrupt},
		{"payload cut short", good[:len(good)-1], ErrCorrupt},
		{"header only", good[:HeaderSize-1], ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.file)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, Slot{Step: 42, Payload: payload}, s)
		})
	}
}

func TestNewest(t *testing.T) {
	torn := with(encode(9, []byte("nine")), func(b []byte) []byte { b[20]++; return b })
	corrupt := with(encode(9, []byte("nine")), func(b []byte) []byte { b[HeaderSize] ^= 1; return b })
	tests := []struct {
		name     string
		slots    [2][]byte // nil: no file
		wantStep uint64
		wantNone bool
	}{
		{"the higher step of two", [2][]byte{encode(7, []byte("seven")), encode(8, []byte("eight"))}, 8, false},
		{"the higher step in slot 0", [2][]byte{encode(8, []byte("eight")), encode(7, []byte("seven"))}, 8, false},
		{"the newer torn: the older", [2][]byte{encode(8, []byte("eight")), torn}, 8, false},
		{"the newer corrupt: the older", [2][]byte{corrupt, encode(8, []byte("eight"))}, 8, false},
		{"one file only", [2][]byte{encode(3, []byte("three")), nil}, 3, false},
		{"none complete", [2][]byte{torn, corrupt}, 0, true},
		{"no files", [2][]byte{nil, nil}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			paths := Paths(dir, 1)
			for i, b := range tt.slots {
				if b != nil {
					require.NoError(t, os.WriteFile(paths[i], b, 0o600))
				}
			}
			s, err := Newest(paths[:]...)
			if tt.wantNone {
				require.ErrorIs(t, err, ErrNone)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantStep, s.Step)
		})
	}
}

var torch testutil.Torch

// TestReadsWhatPythonWrites has the Python package save steps 1..3 and
// die of SIGKILL in the middle of step 4's save (its payload written, not
// its header): the newest complete snapshot is step 3, and its CRC-32C,
// computed by the package's torch lanes, verifies with hash/crc32.
func TestReadsWhatPythonWrites(t *testing.T) {
	python := torch.Require(t)
	dir := t.TempDir()
	script := `
import os, signal, sys, torch, gorun
def hook(step):
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
snaps = gorun.Snapshots(sys.argv[1], 0, _before_header=hook)
torch.manual_seed(0)
model = torch.nn.Linear(300, 200)
for step in range(1, 5):
    with torch.no_grad():
        model.weight.add_(1)
    snaps.save(step, {"model": model, "step": step})
    snaps.wait()
`
	cmd := exec.Command(python, "-c", script, dir)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "python"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	require.Equal(t, "signal: killed", exit.Error(), "output: %s", out)

	paths := Paths(dir, 0)
	s, err := Newest(paths[:]...)
	require.NoError(t, err)
	require.Equal(t, uint64(3), s.Step)
	require.Greater(t, len(s.Payload), 200*300*4, "the payload holds the weights")
	// The other slot holds step 4's payload, but no header.
	var incomplete int
	for _, p := range paths {
		if _, err := ReadSlot(p); err != nil {
			require.ErrorIs(t, err, ErrIncomplete)
			incomplete++
		}
	}
	require.Equal(t, 1, incomplete)
}

// BenchmarkParse verifies a 64 MiB slot: the rate at which the agent can
// check a snapshot (hash/crc32 uses the CPU's CRC-32C instruction).
func BenchmarkParse(b *testing.B) {
	file := encode(1, make([]byte, 64<<20))
	b.SetBytes(int64(len(file)))
	for b.Loop() {
		if _, err := Parse(file); err != nil {
			b.Fatal(err)
		}
	}
}
