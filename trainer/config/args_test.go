package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// SplitArgs finds the file and every --set in each form the flag package
// accepts, before or after the file, and hands the other flags on whole.
func TestSplitArgs(t *testing.T) {
	valued := func(name string) bool { return name == "threads" || name == "metrics" }
	tests := []struct {
		name    string
		args    []string
		toml    string
		sets    []string
		rest    []string
		wantErr string
	}{
		{name: "nothing"},
		{name: "file alone", args: []string{"train.toml"}, toml: "train.toml"},
		{name: "--set x", args: []string{"train.toml", "--set", "a.b=1"}, toml: "train.toml", sets: []string{"a.b=1"}},
		{name: "-set x", args: []string{"-set", "a.b=1", "train.toml"}, toml: "train.toml", sets: []string{"a.b=1"}},
		{name: "--set=x", args: []string{"--set=a.b=1", "train.toml"}, toml: "train.toml", sets: []string{"a.b=1"}},
		{name: "-set=x", args: []string{"train.toml", "-set=a.b=1"}, toml: "train.toml", sets: []string{"a.b=1"}},
		{name: "sets in order, commas whole", args: []string{"--set", `data.files=["a", "b"]`, "train.toml", "-set=model.layers=3"},
			toml: "train.toml", sets: []string{`data.files=["a", "b"]`, "model.layers=3"}},
		{name: "a valued flag takes the next argument", args: []string{"--threads", "4", "train.toml", "--metrics", "m.jsonl"},
			toml: "train.toml", rest: []string{"--threads=4", "--metrics=m.jsonl"}},
		{name: "a valued flag takes a dash as its value", args: []string{"train.toml", "--metrics", "--set"},
			toml: "train.toml", rest: []string{"--metrics=--set"}},
		{name: "a bool flag takes none", args: []string{"--profile", "train.toml"}, toml: "train.toml", rest: []string{"--profile"}},
		{name: "unknown flags are handed on", args: []string{"train.toml", "-bogus"}, toml: "train.toml", rest: []string{"-bogus"}},
		{name: "more files after --", args: []string{"a.toml", "--profile", "b.toml"}, toml: "a.toml", rest: []string{"--profile", "--", "b.toml"}},
		{name: "-- ends the flags", args: []string{"--", "-x.toml", "--set"}, toml: "-x.toml", rest: []string{"--", "--set"}},
		{name: "- is a file", args: []string{"-"}, toml: "-"},
		{name: "--set last", args: []string{"train.toml", "--set"}, wantErr: "flag --set needs a value"},
		{name: "valued flag last", args: []string{"train.toml", "-threads"}, toml: "train.toml", rest: []string{"-threads"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			toml, sets, rest, err := SplitArgs(tt.args, valued)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.toml, toml)
			require.Equal(t, tt.sets, sets)
			require.Equal(t, tt.rest, rest)
		})
	}
}
