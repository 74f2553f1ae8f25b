package etcdembed

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/jobsecret"
)

// Every holder of a secret derives the same CA and client certificate,
// byte for byte; another secret gives others; no secret gives none.
func TestPKIDeterministic(t *testing.T) {
	secret := newSecret(t)
	a, err := NewPKI(secret)
	require.NoError(t, err)
	b, err := NewPKI(secret)
	require.NoError(t, err)
	require.Equal(t, a.CAPEM(), b.CAPEM())
	certA, keyA, err := a.Client(secret)
	require.NoError(t, err)
	certB, keyB, err := b.Client(secret)
	require.NoError(t, err)
	require.Equal(t, certA, certB)
	require.Equal(t, keyA, keyB)

	other, err := NewPKI(newSecret(t))
	require.NoError(t, err)
	require.NotEqual(t, a.CAPEM(), other.CAPEM())
	require.NotEqual(t, a.Name(), other.Name())

	_, err = NewPKI(jobsecret.Secret{})
	require.ErrorContains(t, err, "no job secret")

	block, _ := pem.Decode(certA)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(a.caCert)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err, "the client certificate chains to the job CA")
}

// A member with a secret speaks only TLS, and only to clients with the
// job's certificate, on both ports: plain HTTP gets no answer, a client
// without a certificate or with another job's is refused, and a client
// of another job's CA does not take the member for its own.
func TestServerTLSOnly(t *testing.T) {
	ctx := testCtx(t)
	secret := newSecret(t)
	cfg, s := startWithSecret(t, ctx, secret)
	require.Equal(t, []string{"https://" + cfg.ClientAddr}, s.Endpoints())

	for _, addr := range []string{cfg.ClientAddr, cfg.PeerAddr} {
		reply := plainHTTP(t, addr)
		require.NotContains(t, reply, "HTTP/", "plain HTTP to %s gets no HTTP answer", addr)

		p, err := NewPKI(secret)
		require.NoError(t, err)
		roots := x509.NewCertPool()
		roots.AddCert(p.caCert)
		noCert := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		require.Error(t, tlsExchange(addr, noCert), "a client without a certificate at %s", addr)

		otherCfg, err := ClientTLS(newSecret(t))
		require.NoError(t, err)
		err = tlsExchange(addr, otherCfg)
		require.ErrorContains(t, err, "not from this job's secret", "another job's client at %s", addr)

		mine, err := ClientTLS(secret)
		require.NoError(t, err)
		require.NoError(t, tlsExchange(addr, mine), "the job's client at %s", addr)
	}
}

// plainHTTP sends a plain HTTP request to addr and returns what came back
// before the server hung up or went quiet for a second.
func plainHTTP(t *testing.T, addr string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /version HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Second)))
	got, _ := io.ReadAll(conn)
	return string(got)
}

// tlsExchange completes a TLS handshake with addr and reads from it,
// returning the first error: in TLS 1.3 a server refuses a client's
// certificate only after the client's side of the handshake is done.
func tlsExchange(addr string, cfg *tls.Config) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		return err
	}
	if err := conn.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

// needTool returns the path of an external tool, skipping the test when
// it is absent, unless CI=true.
func needTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is needed in CI: %v", name, err)
		}
		t.Skipf("%s not installed", name)
	}
	return path
}

// openssl s_client against a member with a secret shows its certificate,
// verified against the job CA that WriteClientFiles writes; etcdctl with
// the written files reads and writes the job's keys.
func TestServerTLSTools(t *testing.T) {
	ctx := testCtx(t)
	secret := newSecret(t)
	cfg, s := startWithSecret(t, ctx, secret)
	files, err := WriteClientFiles(filepath.Join(t.TempDir(), "etcdctl"), secret)
	require.NoError(t, err)
	for _, path := range []string{files.CA, files.Cert, files.Key, files.Password} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), path)
	}

	t.Run("openssl", func(t *testing.T) {
		openssl := needTool(t, "openssl")
		cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", cfg.ClientAddr, "-CAfile", files.CA,
			"-cert", files.Cert, "-key", files.Key, "-verify_return_error", "-showcerts")
		cmd.Stdin = strings.NewReader("")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "gorun etcd member "+cfg.Name)
		p, err := NewPKI(secret)
		require.NoError(t, err)
		require.Contains(t, string(out), p.Name())
		require.Contains(t, string(out), "Verify return code: 0 (ok)")
	})

	t.Run("etcdctl", func(t *testing.T) {
		needTool(t, "etcdctl")
		line := files.EtcdctlShell(s.Endpoints())
		run := func(args string) (string, error) {
			cmd := exec.CommandContext(ctx, "sh", "-c", line+" "+args)
			cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		out, err := run("put " + AuthPrefix + "from-etcdctl yes")
		require.NoError(t, err, out)
		out, err = run("get --print-value-only " + AuthPrefix + "from-etcdctl")
		require.NoError(t, err, out)
		require.Equal(t, "yes", strings.TrimSpace(out))
		out, err = run("get /elsewhere")
		require.Error(t, err, "only %s: %s", AuthPrefix, out)
	})
}

// The CA written for etcdctl is the one the member serves with.
func TestClientFilesMatchMember(t *testing.T) {
	secret := newSecret(t)
	files, err := WriteClientFiles(t.TempDir(), secret)
	require.NoError(t, err)
	member, err := writeMemberTLS(t.TempDir(), secret, "m0", []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	require.NoError(t, err)
	a, err := os.ReadFile(files.CA)
	require.NoError(t, err)
	b, err := os.ReadFile(member.ca)
	require.NoError(t, err)
	require.True(t, bytes.Equal(a, b))
}

// startWithSecret starts a single member with secret on free loopback
// ports, closed (and its data dir removed) in t's cleanup.
func startWithSecret(t *testing.T, ctx context.Context, secret jobsecret.Secret) (Config, *Server) {
	t.Helper()
	cfg := fastServer(t)
	cfg.Secret = secret
	cfg.RemoveDataDir = true
	s, err := Start(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return cfg, s
}
