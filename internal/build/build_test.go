package build

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	const path = "github.com/gorun/gorun"
	tests := []struct {
		name     string
		version  string
		settings map[string]string
		want     string
	}{
		{"go run: nothing to tell builds apart", "(devel)", nil, ""},
		{"-buildvcs=false", "", map[string]string{"vcs.modified": "true"}, ""},
		{"clean commit", "v0.0.0-20261126211200-c6b0957abcde",
			map[string]string{"vcs.revision": "c6b0957abcdef", "vcs.modified": "false"},
			path + " v0.0.0-20261126211200-c6b0957abcde c6b0957abcdef"},
		{"changed tree", "(devel)", map[string]string{"vcs.revision": "c6b0957abcdef", "vcs.modified": "true"},
			path + " c6b0957abcdef+dirty"},
		{"a module version without vcs", "v1.2.3", nil, path + " v1.2.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := &debug.BuildInfo{Main: debug.Module{Path: path, Version: tt.version}}
			for k, v := range tt.settings {
				info.Settings = append(info.Settings, debug.BuildSetting{Key: k, Value: v})
			}
			require.Equal(t, tt.want, Of(info))
		})
	}
}

func TestOfFile(t *testing.T) {
	_, err := OfFile(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	notGo := filepath.Join(t.TempDir(), "script")
	require.NoError(t, os.WriteFile(notGo, []byte("#!/bin/sh\n"), 0o755))
	_, err = OfFile(notGo)
	require.Error(t, err)
	self, err := os.Executable()
	require.NoError(t, err)
	id, err := OfFile(self)
	require.NoError(t, err)
	info, ok := debug.ReadBuildInfo()
	require.True(t, ok)
	require.Equal(t, Of(info), id, "the test binary read from its file and from itself")
}
