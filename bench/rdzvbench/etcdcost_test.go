package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name, stat string
		want       time.Duration
		wantErr    bool
	}{
		{name: "plain", stat: "42 (etcd) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0",
			want: 3 * time.Second},
		{name: "name with spaces and parens", stat: "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 0 0",
			want: 30 * time.Millisecond},
		{name: "no closing paren", stat: "7 (etcd S 1", wantErr: true},
		{name: "too few fields", stat: "7 (etcd) S 1 2 3", wantErr: true},
		{name: "not a number", stat: "7 (etcd) S 1 7 7 0 -1 0 0 0 0 0 x 2 0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU(tt.stat)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestProcessCPUOfThisProcess(t *testing.T) {
	_, err := processCPU(os.Getpid())
	require.NoError(t, err)
}
