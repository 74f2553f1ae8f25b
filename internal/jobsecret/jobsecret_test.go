package jobsecret

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const hex32 = "00112233445566778899aabbccddeeff" // 16 bytes

func TestParse(t *testing.T) {
	tests := []struct {
		name, text, want string // want: "" for valid, else a substring of the error
	}{
		{"16 bytes", hex32, ""},
		{"32 bytes with white space", " " + hex32 + hex32 + "\n", ""},
		{"upper case", strings.ToUpper(hex32), ""},
		{"empty", "", "empty"},
		{"blank", " \n", "empty"},
		{"15 bytes", hex32[:30], "120 bits is too short: want at least 128"},
		{"odd digits", hex32 + "a", "even number"},
		{"not hex", strings.Repeat("zz", 16), "not hexadecimal"},
		{"base64", "ABEiM0RVZneImaq7zN3u/w==AAAAAAAA", "not hexadecimal"},
		{"too long", strings.Repeat("ab", maxText), "longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.text)
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)
				require.True(t, s.IsZero())
				if len(tc.text) >= 8 {
					require.NotContains(t, err.Error(), strings.TrimSpace(tc.text), "no value in the error")
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, strings.ToLower(strings.TrimSpace(tc.text)), s.Encode())
		})
	}
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		zero  bool
		wantE string
	}{
		{"unset", nil, true, ""},
		{"set", map[string]string{EnvVar: hex32}, false, ""},
		{"set but empty", map[string]string{EnvVar: ""}, true, "GORUN_JOB_SECRET: empty"},
		{"short", map[string]string{EnvVar: "abcd"}, true, "GORUN_JOB_SECRET: 16 bits is too short"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := FromEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantE != "" {
				require.ErrorContains(t, err, tc.wantE)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.zero, s.IsZero())
		})
	}
}

func TestReadFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string
	}{
		{"private", hex32 + "\n", 0o600, ""},
		{"read-only private", hex32, 0o400, ""},
		{"group readable", hex32, 0o640, "mode 0640): chmod 600"},
		{"world readable", hex32, 0o644, "chmod 600"},
		{"group writable", hex32, 0o620, "chmod 600"},
		{"short", "abcd", 0o600, "too short"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "secret")
			require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o600))
			require.NoError(t, os.Chmod(path, tc.mode))
			s, err := ReadFile(path)
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)
				require.ErrorContains(t, err, path)
				return
			}
			require.NoError(t, err)
			require.Equal(t, hex32, s.Encode())
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, err := ReadFile(filepath.Join(t.TempDir(), "none"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("directory", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o700))
		_, err := ReadFile(dir)
		require.ErrorContains(t, err, "not a regular file")
	})
}

func TestNewIsFreshAndParses(t *testing.T) {
	a, err := New()
	require.NoError(t, err)
	b, err := New()
	require.NoError(t, err)
	require.False(t, a.Equal(b))
	require.Len(t, a.Encode(), 2*newBytes)
	back, err := Parse(a.Encode())
	require.NoError(t, err)
	require.True(t, back.Equal(a))
}

func TestNeverPrinted(t *testing.T) {
	s, err := Parse(hex32)
	require.NoError(t, err)
	js, err := json.Marshal(struct{ S Secret }{s})
	require.NoError(t, err)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, s, s, s), string(js)} {
		require.NotContains(t, out, hex32)
		require.Contains(t, out, Redacted)
	}
}

func TestKeysDifferByPurposeAndSecret(t *testing.T) {
	a, err := Parse(hex32)
	require.NoError(t, err)
	b, err := Parse(strings.Repeat("f", 32))
	require.NoError(t, err)
	require.Len(t, a.Key("comm"), 32)
	require.Equal(t, a.Key("comm"), a.Key("comm"))
	require.NotEqual(t, a.Key("comm"), a.Key("etcd"))
	require.NotEqual(t, a.Key("comm"), b.Key("comm"))
	require.NotEqual(t, a.Key("comm"), Secret{}.Key("comm"))
}
