package workerlog_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/workerlog"
)

func TestParseStd(t *testing.T) {
	const out, errs, both = workerlog.Stdout, workerlog.Stderr, workerlog.Stdout | workerlog.Stderr
	tests := []struct {
		in      string
		want    []workerlog.Std // for local ranks 0..3
		wantStr string
	}{
		{"", []workerlog.Std{0, 0, 0, 0}, "0"},
		{"0", []workerlog.Std{0, 0, 0, 0}, "0"},
		{"1", []workerlog.Std{out, out, out, out}, "1"},
		{"2", []workerlog.Std{errs, errs, errs, errs}, "2"},
		{" 3 ", []workerlog.Std{both, both, both, both}, "3"},
		{"0:1,1:2", []workerlog.Std{out, errs, 0, 0}, "0:1,1:2"},
		{"3:3, 1:1", []workerlog.Std{0, out, 0, both}, "1:1,3:3"},
		{"2:0", []workerlog.Std{0, 0, 0, 0}, "2:0"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			spec, err := workerlog.ParseStd(tt.in)
			require.NoError(t, err)
			for lr, want := range tt.want {
				assert.Equal(t, want, spec.For(lr), "local rank %d", lr)
			}
			if strings.Contains(tt.in, ":") {
				assert.Equal(t, workerlog.Std(0), spec.For(99), "local ranks not listed get none")
			} else {
				assert.Equal(t, tt.want[0], spec.For(99), "one value applies to every local rank")
			}
			assert.Equal(t, tt.wantStr, spec.String())
			again, err := workerlog.ParseStd(spec.String())
			require.NoError(t, err)
			assert.Equal(t, spec.String(), again.String())
		})
	}
}

func TestParseStdInvalid(t *testing.T) {
	tests := []struct {
		in      string
		wantBad string // the part the error names
	}{
		{"4", `value "4"`},
		{"-1", `value "-1"`},
		{"x", `value "x"`},
		{"1,2", `value "1,2"`},
		{"0:4", `value "4"`},
		{"0:", `value ""`},
		{":1", `local rank ""`},
		{"-1:1", `local rank "-1"`},
		{"a:1", `local rank "a"`},
		{"0:1,", `"" is not local_rank:value`},
		{"0:1,1", `"1" is not local_rank:value`},
		{"1:2:3", `value "2:3"`},
		{"0:1,0:2", "local rank 0 is given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			spec, err := workerlog.ParseStd(tt.in)
			require.Error(t, err)
			assert.True(t, spec.IsZero())
			msg := err.Error()
			assert.Contains(t, msg, `"`+tt.in+`"`, "the error quotes the input")
			assert.Contains(t, msg, tt.wantBad, "the error names the bad part")
			assert.Contains(t, msg, "0 (none), 1 (stdout), 2 (stderr) or 3 (both)", "the error says what is allowed")
		})
	}
}

func TestStd(t *testing.T) {
	both := workerlog.Stdout | workerlog.Stderr
	assert.Equal(t, "none", workerlog.Std(0).String())
	assert.Equal(t, "stdout", workerlog.Stdout.String())
	assert.Equal(t, "stderr", workerlog.Stderr.String())
	assert.Equal(t, "stdout+stderr", both.String())
	assert.True(t, both.Has(workerlog.Stderr))
	assert.False(t, workerlog.Stdout.Has(workerlog.Stderr))
	assert.Equal(t, both, workerlog.AllRanks(both).For(7))
	assert.True(t, workerlog.StdSpec{}.IsZero())
	assert.False(t, workerlog.AllRanks(workerlog.Stdout).IsZero())
}

func TestParseLocalRanks(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string
	}{
		{"", nil, ""},
		{"0", []int{0}, ""},
		{"0,2", []int{0, 2}, ""},
		{" 3, 1 ,1", []int{1, 3}, ""},
		{"0,", nil, `local rank ""`},
		{"-1", nil, `local rank "-1"`},
		{"0-3", nil, `local rank "0-3"`},
		{"a", nil, `local rank "a"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := workerlog.ParseLocalRanks(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), `"`+tt.in+`"`)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Contains(t, err.Error(), `like "0,2"`)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
