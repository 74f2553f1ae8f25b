package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// One classification decides, for the store's calls and for Dial, what
// is worth trying again.
func TestTransient(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: wrapErrno(syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"attempt timed out", context.DeadlineExceeded, true},
		{"attempt timed out, wrapped", fmt.Errorf("put: %w", context.DeadlineExceeded), true},
		{"grpc deadline", status.Error(codes.DeadlineExceeded, "deadline"), true},
		{"no leader", rpctypes.ErrGRPCNoLeader, true},
		{"no leader (client)", rpctypes.ErrNoLeader, true},
		{"leader changed", rpctypes.ErrGRPCLeaderChanged, true},
		{"request timed out", rpctypes.ErrGRPCTimeout, true},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), true},
		{"aborted", status.Error(codes.Aborted, "aborted"), true},
		{"lease being renewed", rpctypes.ErrLeaseNotFound, true},
		{"lease being renewed (grpc)", rpctypes.ErrGRPCLeaseNotFound, true},
		{"too many requests", rpctypes.ErrTooManyRequests, true},
		{"too many requests (grpc)", rpctypes.ErrGRPCRequestTooManyRequests, true},
		{"connection refused", refused, true},
		{"name not resolved", &net.DNSError{Err: "no such host", Name: "node1", IsNotFound: true}, true},
		{"no TLS handshake", errNoHandshake, true},

		{"cancelled", context.Canceled, false},
		{"client closing", status.Error(codes.Canceled, "grpc: the client connection is closing"), false},
		{"request too large", rpctypes.ErrGRPCRequestTooLarge, false},
		{"request too large (client)", rpctypes.ErrRequestTooLarge, false},
		{"too large to send", status.Error(codes.ResourceExhausted, "trying to send message larger than max"), false},
		{"database full", rpctypes.ErrGRPCNoSpace, false},
		{"auth failed", rpctypes.ErrGRPCAuthFailed, false},
		{"auth failed (client)", rpctypes.ErrAuthFailed, false},
		{"permission denied", rpctypes.ErrGRPCPermissionDenied, false},
		{"permission denied (client), wrapped", fmt.Errorf("put: %w", rpctypes.ErrPermissionDenied), false},
		{"user empty", rpctypes.ErrGRPCUserEmpty, false},
		{"auth not enabled", rpctypes.ErrGRPCAuthNotEnabled, false},
		{"not etcd", status.Error(codes.Unimplemented, "unknown service etcdserverpb.Maintenance"), false},
		{"bad certificate", &tls.CertificateVerificationError{Err: errors.New("unknown authority")}, false},
		{"TLS alert", tls.AlertError(42), false},
		{"TLS against plain text", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, transient(tc.err), "%v", tc.err)
			var perm *backoff.PermanentError
			require.Equal(t, !tc.want, errors.As(classify(tc.err), &perm), "classify agrees")
		})
	}
	require.NoError(t, classify(nil))
}

// wrapErrno is a syscall error as the net package wraps it.
func wrapErrno(errno syscall.Errno) error { return fmt.Errorf("connect: %w", errno) }

// retry tries a transient failure again and gives up at once on any
// other, returning it as it is.
func TestRetry(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failures  []error // what the attempts return before one succeeds
		wantCalls int
		wantErr   error
	}{
		{"succeeds", nil, 1, nil},
		{"etcd comes back", []error{rpctypes.ErrGRPCNoLeader, status.Error(codes.Unavailable, "down")}, 3, nil},
		{"too large fails at once", []error{rpctypes.ErrRequestTooLarge}, 1, rpctypes.ErrRequestTooLarge},
		{"permission fails at once", []error{rpctypes.ErrGRPCTimeout, rpctypes.ErrPermissionDenied}, 2, rpctypes.ErrPermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retry(context.Background(), time.Hour, func(context.Context) error {
				calls++
				if calls <= len(tc.failures) {
					return tc.failures[calls-1]
				}
				return nil
			})
			require.Equal(t, tc.wantCalls, calls)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.wantErr, err, "returned as it is")
		})
	}
}
