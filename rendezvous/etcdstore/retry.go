package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Calls to etcd are retried: a request in flight to a member that just
// died is lost, and etcd answers it only after its request timeout; an
// etcd that is down or frozen answers nothing until it is back.
const (
	callTimeout  = 3 * time.Second  // one attempt
	callPatience = 20 * time.Second // all attempts, unless WithPatience
)

// retry runs call until it succeeds, fails for good (see transient), ctx
// ends or patience passes, each attempt bounded by callTimeout, with a
// back-off between attempts. Running out of patience is an error that
// says how long etcd did not answer; an error that is not transient is
// returned at once, as it is.
func retry(ctx context.Context, patience time.Duration, call func(ctx context.Context) error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 50*time.Millisecond, time.Second, patience
	err := backoff.Retry(func() error {
		actx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		err := call(actx)
		if err != nil && ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return classify(err)
	}, backoff.WithContext(bo, ctx))
	if err != nil && ctx.Err() == nil && transient(err) {
		return fmt.Errorf("etcd did not answer within %s: %w", patience, err)
	}
	return err
}

// classify marks err as permanent (backoff.Permanent) when retrying
// cannot cure it (see transient); nil and transient errors are returned
// as they are.
func classify(err error) error {
	if err == nil || transient(err) {
		return err
	}
	return backoff.Permanent(err)
}

// transient reports whether a failed call to etcd, or an attempt to reach
// it, may succeed when tried again: etcd, or the way to it, is down, slow
// or electing a leader (no answer, a timeout, "unavailable"), etcd asks
// to slow down, or this agent's lease is being re-established. Anything
// etcd refused for good is not (a rejected user or password, a permission
// refused, a bad or too large request, a full database), nor a TLS
// failure (a bad certificate, TLS against a plain server), nor a
// cancelled call. An error with no answer from etcd in it at all (a
// refused connection, a host name not resolved yet) is transient.
func transient(err error) bool {
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, rpctypes.ErrLeaseNotFound), errors.Is(err, rpctypes.ErrGRPCLeaseNotFound),
		errors.Is(err, rpctypes.ErrTooManyRequests), errors.Is(err, rpctypes.ErrGRPCRequestTooManyRequests):
		return true
	case refusedCredentials(err), tlsFailure(err):
		return false
	}
	code, answered := grpcCode(err)
	if !answered {
		return true
	}
	return code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Aborted
}

// CredentialsRefused says whether err (from Dial or a call) is etcd
// refusing this client's user, password or permissions: retrying with the
// same ones cannot help.
func CredentialsRefused(err error) bool { return refusedCredentials(err) }

// refusedCredentials says whether etcd refused this client's user,
// password or permissions.
func refusedCredentials(err error) bool {
	for _, refused := range []error{
		rpctypes.ErrAuthFailed, rpctypes.ErrGRPCAuthFailed,
		rpctypes.ErrPermissionDenied, rpctypes.ErrGRPCPermissionDenied,
		rpctypes.ErrUserEmpty, rpctypes.ErrGRPCUserEmpty,
	} {
		if errors.Is(err, refused) {
			return true
		}
	}
	return false
}

// tlsFailure says whether err is a TLS handshake that failed for good: a
// certificate not verified, an alert from the peer, or a plain-text
// answer to a TLS client.
func tlsFailure(err error) bool {
	var certErr *tls.CertificateVerificationError
	var alert tls.AlertError
	var recordErr tls.RecordHeaderError
	// A certificate judged by our own verification (the job CA's, in
	// VerifyPeerCertificate) comes as x509's errors, not wrapped in tls's.
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &certErr) || errors.As(err, &alert) || errors.As(err, &recordErr) ||
		errors.As(err, &unknownCA) || errors.As(err, &invalid)
}

// grpcCode returns the gRPC code etcd answered err with; answered is
// false when err carries none.
func grpcCode(err error) (code codes.Code, answered bool) {
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		return etcdErr.Code(), true
	}
	if st, ok := status.FromError(err); ok {
		return st.Code(), true
	}
	return codes.Unknown, false
}
