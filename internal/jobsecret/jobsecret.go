package jobsecret

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// EnvVar names the variable that carries the secret to every agent and
// every worker of a job.
const EnvVar = "GORUN_JOB_SECRET"

// MinBytes is the shortest secret accepted: 128 bits.
const MinBytes = 16

// newBytes is the length of a secret New makes: 256 bits.
const newBytes = 32

// maxText bounds what Parse and ReadFile accept: 4096 hex digits is far
// more than any secret needs.
const maxText = 4096

// Redacted is what a Secret prints as, anywhere.
const Redacted = "[redacted]"

// Secret is a job's shared secret. The zero Secret is "none". It prints as
// Redacted (fmt, JSON, text marshalling); Encode gives its value.
type Secret struct{ b []byte }

// New returns a fresh random secret of 256 bits, or the error of the
// system's random source.
func New() (Secret, error) {
	b := make([]byte, newBytes)
	if _, err := rand.Read(b); err != nil {
		return Secret{}, fmt.Errorf("jobsecret: new: %w", err)
	}
	return Secret{b: b}, nil
}

// Parse decodes a secret written as hexadecimal digits (at least 32, that
// is 16 bytes; surrounding white space is ignored), as Encode writes it
// and `openssl rand -hex 32` prints it. Errors name what is wrong, never
// the value.
func Parse(text string) (Secret, error) {
	text = strings.TrimSpace(text)
	switch {
	case text == "":
		return Secret{}, errors.New("empty: want at least 32 hex digits (16 random bytes), e.g. from gorun job-secret or openssl rand -hex 32")
	case len(text) > maxText:
		return Secret{}, fmt.Errorf("%d characters is longer than %d", len(text), maxText)
	case len(text)%2 != 0:
		return Secret{}, fmt.Errorf("%d hex digits: want an even number (two per byte)", len(text))
	}
	b, err := hex.DecodeString(text)
	if err != nil {
		return Secret{}, errors.New("not hexadecimal: want only the digits 0-9 and a-f (e.g. from gorun job-secret or openssl rand -hex 32)")
	}
	if len(b) < MinBytes {
		return Secret{}, fmt.Errorf("%d bits is too short: want at least %d (%d hex digits)", 8*len(b), 8*MinBytes, 2*MinBytes)
	}
	return Secret{b: b}, nil
}

// FromEnv reads EnvVar through lookup: the zero Secret when it is unset,
// an error naming the variable when it is set but not a valid secret.
func FromEnv(lookup func(string) (string, bool)) (Secret, error) {
	v, ok := lookup(EnvVar)
	if !ok {
		return Secret{}, nil
	}
	s, err := Parse(v)
	if err != nil {
		return Secret{}, fmt.Errorf("%s: %w", EnvVar, err)
	}
	return s, nil
}

// ReadFile reads a secret (as Parse takes it) from path, which must be a
// regular file of this user that neither group nor others may read or
// write, as ssh asks of a private key; the error says how to fix it.
func ReadFile(path string) (Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return Secret{}, fmt.Errorf("job secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // the file opened, not a name that may change under us
	if err != nil {
		return Secret{}, fmt.Errorf("job secret file: %w", err)
	}
	if err := checkPrivate(path, fi); err != nil {
		return Secret{}, err
	}
	text, err := io.ReadAll(io.LimitReader(f, maxText+64))
	if err != nil {
		return Secret{}, fmt.Errorf("job secret file %s: %w", path, err)
	}
	s, err := Parse(string(text))
	if err != nil {
		return Secret{}, fmt.Errorf("job secret file %s: %w", path, err)
	}
	return s, nil
}

// checkPrivate refuses a file others could read or change.
func checkPrivate(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("job secret file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("job secret file %s: group or others may access it (mode %04o): chmod 600 %s", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("job secret file %s: owned by uid %d, not by this user (uid %d)", path, st.Uid, os.Getuid())
	}
	return nil
}

// IsZero reports whether s is "no secret".
func (s Secret) IsZero() bool { return len(s.b) == 0 }

// Encode returns s as Parse reads it (lowercase hex), for EnvVar.
func (s Secret) Encode() string { return hex.EncodeToString(s.b) }

// String returns Redacted, so that a Secret printed by mistake shows nothing.
func (s Secret) String() string { return Redacted }

// GoString returns Redacted, for %#v.
func (s Secret) GoString() string { return Redacted }

// MarshalText returns Redacted, so that JSON and other encodings show nothing.
func (s Secret) MarshalText() ([]byte, error) { return []byte(Redacted), nil }

// Equal reports whether s and o are the same secret, in constant time.
func (s Secret) Equal(o Secret) bool { return hmac.Equal(s.b, o.b) }

// Key derives the 32-byte key for one purpose (e.g. "comm") from s:
// HMAC-SHA256(secret, "gorun job secret v1: "+purpose), so that a key
// learnt from one use says nothing of the others. The zero Secret gives a
// key anyone can compute: it authenticates nothing.
func (s Secret) Key(purpose string) []byte {
	m := hmac.New(sha256.New, s.b)
	m.Write([]byte("gorun job secret v1: " + purpose))
	return m.Sum(nil)
}
