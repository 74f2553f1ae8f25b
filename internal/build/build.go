// Package build names the build a Go binary came from, so that a gorun
// agent can tell that the gorun-worker beside it was built apart
// (bin/gorun rebuilt, bin/gorun-worker left over from an older tree) and
// not start workers that may speak another version of its channel.
package build

import (
	"debug/buildinfo"
	"runtime/debug"
)

// OfFile is the build of the Go binary at path (see Of), read from the
// file without running it; "" when the binary carries no version and no
// commit. The error is the file's: missing, unreadable, not a Go binary.
func OfFile(path string) (string, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", err
	}
	return Of(info), nil
}

// Of is the build that info describes: the main module's path and
// version and, where the go command stamped them, the commit and whether
// the tree had changes ("github.com/gorun/gorun v0.0.0-... 1a2b3c4d+dirty").
// It is "" when info names no version and no commit (go run, or a build
// with -buildvcs=false): such a build cannot be told apart from another.
// Two builds of one commit with different uncommitted changes share an ID.
func Of(info *debug.BuildInfo) string {
	var revision, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	version := info.Main.Version
	if version == "(devel)" {
		version = ""
	}
	if version == "" && revision == "" {
		return ""
	}
	id := info.Main.Path
	if version != "" {
		id += " " + version
	}
	if revision != "" {
		id += " " + revision + modified
	}
	return id
}
