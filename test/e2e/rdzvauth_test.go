package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/rendezvous/etcdembed"
)

// etcdctl runs Debian's etcdctl (v3 API) against endpoint with args and
// returns its combined output and whether it succeeded; an --endpoints
// among args replaces endpoint.
func etcdctl(t *testing.T, endpoint string, args ...string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	flags := []string{"--dial-timeout=5s", "--command-timeout=10s"}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--endpoints=") }) {
		flags = append(flags, "--endpoints="+endpoint) // a repeated --endpoints would add to the list
	}
	cmd := exec.CommandContext(ctx, "etcdctl", append(flags, args...)...)
	cmd.Env = buildEnv([]string{"ETCDCTL_API=3", "ETCDCTL_USER", "ETCDCTL_PASSWORD", "ETCDCTL_ENDPOINTS"})
	out, err := cmd.CombinedOutput()
	t.Logf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
	return string(out), err == nil
}

// guardedJob starts two agents holding secret (node-a at addrs[0], node-b
// at addrs[1]) of a job with run id "guarded" and the args of its
// rendezvous, whose workers run until the test creates $OUT/release, and
// returns them and OUT once both workers started.
func guardedJob(t *testing.T, secret jobsecret.Secret, addrs []string, rdzv ...string) ([]*gorunProc, string) {
	t.Helper()
	out := t.TempDir()
	var agents []*gorunProc
	for i, name := range []string{"node-a", "node-b"} {
		args := append([]string{"--nnodes=2", "--nproc-per-node=1", "--rdzv-id=guarded", "--node-name=" + name, "--local-addr=" + addrs[i]}, rdzv...)
		agents = append(agents, startGorun(t, name, []string{"OUT=" + out, jobsecret.EnvVar + "=" + secret.Encode()},
			append(args, "--", "/bin/sh", "-c", outageWorker)...))
	}
	deadline := time.Now().Add(60 * time.Second)
	for files, _ := filepath.Glob(filepath.Join(out, "round0-rank*")); len(files) < 2; files, _ = filepath.Glob(filepath.Join(out, "round0-rank*")) {
		if time.Now().After(deadline) {
			t.Fatalf("round 0: %d of 2 workers started", len(files))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return agents, out
}

// requireRefused checks, with etcdctl, that the etcd at endpoint serves
// only mutual TLS with the job's certificates (plain HTTP, and TLS without
// the job's client certificate, get nothing); that with them it refuses a
// wrong password, root with a guess, and keys outside the job's prefix;
// and that the holder of secret reads the keys of run "guarded".
func requireRefused(t *testing.T, endpoint string, secret jobsecret.Secret) {
	t.Helper()
	files, err := etcdembed.WriteClientFiles(filepath.Join(t.TempDir(), "etcdctl"), secret)
	if err != nil {
		t.Fatal(err)
	}
	user, password := etcdembed.Credentials(secret)
	wrong := strings.Repeat("0", len(password))
	tls := []string{"--endpoints=https://" + endpoint, "--cacert=" + files.CA, "--cert=" + files.Cert, "--key=" + files.Key}
	unreachable := []struct {
		name string
		args []string
	}{
		{"plain HTTP", []string{"get", "--prefix", "/gorun/"}},
		{"TLS without the job's client certificate", []string{"--endpoints=https://" + endpoint, "--cacert=" + files.CA, "get", "--prefix", "/gorun/"}},
	}
	for _, tc := range unreachable {
		// etcdctl retries a connection it cannot make until its dial and
		// command timeouts: these end there, so they are short (a later
		// flag wins).
		if got, ok := etcdctl(t, endpoint, append([]string{"--dial-timeout=2s", "--command-timeout=2s"}, tc.args...)...); ok || strings.Contains(got, "/gorun/") {
			t.Errorf("%s: etcdctl got an answer: %s", tc.name, got)
		}
	}
	refused := []struct {
		name string
		args []string
		want string
	}{
		{"read with a wrong password", []string{"--user=" + user + ":" + wrong, "get", "--prefix", "/gorun/"}, "authentication failed"},
		{"write with a wrong password", []string{"--user=" + user + ":" + wrong, "put", "/gorun/guarded/0/state", `{"phase":"closed"}`}, "authentication failed"},
		{"root with a guess", []string{"--user=root:root", "user", "list"}, "authentication failed"},
	}
	for _, tc := range refused {
		if got, ok := etcdctl(t, endpoint, append(tls, tc.args...)...); ok || !strings.Contains(got, tc.want) {
			t.Errorf("%s: etcdctl succeeded or did not say %q: %s", tc.name, tc.want, got)
		}
	}
	// The job's client certificate names the agents' user: it alone
	// reaches the job's keys, and nothing else.
	if got, ok := etcdctl(t, endpoint, append(tls, "put", "/elsewhere", "x")...); ok || !strings.Contains(got, "permission denied") {
		t.Errorf("the client certificate outside %s: etcdctl succeeded or did not say permission denied: %s", etcdembed.AuthPrefix, got)
	}
	got, ok := etcdctl(t, endpoint, append(tls, "--user="+user+":"+password, "get", "--prefix", "--keys-only", "/gorun/guarded/")...)
	if !ok || !strings.Contains(got, "/gorun/guarded/0/state") {
		t.Errorf("etcdctl with the secret's certificate and credentials does not read the job's state: %s", got)
	}
}

// release lets the workers of a guarded job finish and checks that
// every agent exits 0: the refused clients did not disturb the job.
func release(t *testing.T, agents []*gorunProc, out string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(out, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if r := a.wait(); r.ExitCode != 0 {
			t.Errorf("%s: exit %d, want 0", a.name, r.ExitCode)
		}
	}
}

func needEtcdctl(t *testing.T) {
	if _, err := exec.LookPath("etcdctl"); err != nil {
		testutil.SkipOrFail(t, "etcdctl not found: apt-get install etcd-client")
	}
}

// A `gorun rendezvous serve` started with the job secret, while two
// agents holding it run a job through it: etcdctl without credentials,
// or with a wrong password, can neither read nor write the job's keys;
// the job is not disturbed and ends well; gorun status reads the keys
// with the secret only; an agent with another secret is refused, and
// told why.
func TestRendezvousServeAuth(t *testing.T) {
	needEtcdctl(t)
	secret, err := jobsecret.New()
	if err != nil {
		t.Fatal(err)
	}
	withSecret := []string{jobsecret.EnvVar + "=" + secret.Encode()}
	port := testutil.FreePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	serve := startGorun(t, "etcd", withSecret, "rendezvous", "serve", "--listen="+endpoint,
		fmt.Sprintf("--peer-listen=127.0.0.1:%d", testutil.FreePort(t)), "--data-dir="+filepath.Join(t.TempDir(), "etcd"))
	if !serve.waitOutput(60*time.Second, func(out string) bool { return strings.Contains(out, "only for holders of the job secret") }) {
		t.Fatalf("gorun rendezvous serve did not say it serves with the secret:\n%s\n%s", serve.stdout.String(), serve.stderr.String())
	}
	agents, out := guardedJob(t, secret, []string{"127.0.0.1", "127.0.0.1"}, "--rdzv-backend=etcd", "--rdzv-endpoint="+endpoint)
	requireRefused(t, endpoint, secret)
	release(t, agents, out)

	status := runGorun(t, withSecret, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=guarded")
	if !strings.Contains(status.Stdout, "succeeded") {
		t.Errorf("gorun status with the secret:\n%s\n%s", status.Stdout, status.Stderr)
	}
	status = runGorun(t, []string{jobsecret.EnvVar}, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=guarded")
	if status.ExitCode == 0 {
		t.Errorf("gorun status without the secret: exit %d, want a refusal:\n%s", status.ExitCode, status.Stderr)
	}
	other, err := jobsecret.New()
	if err != nil {
		t.Fatal(err)
	}
	stranger := runGorun(t, []string{jobsecret.EnvVar + "=" + other.Encode()},
		"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd", "--rdzv-endpoint="+endpoint,
		"--rdzv-id=guarded", "--node-name=node-x", "--local-addr=127.0.0.1", "--", "/bin/true")
	if stranger.ExitCode == 0 || !strings.Contains(stranger.Stderr, "not from this job's secret") || !strings.Contains(stranger.Stderr, "GORUN_JOB_SECRET") {
		t.Errorf("an agent with another secret: exit %d, want a refusal that names the secret:\n%s", stranger.ExitCode, stranger.Stderr)
	}
}

// torchrun's c10d recipe with a job secret: the etcd that the node
// owning the endpoint embeds refuses etcdctl without the secret while
// the job runs, and the job ends well.
func TestC10dEmbeddedAuth(t *testing.T) {
	needEtcdctl(t)
	secret, err := jobsecret.New()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("%s:%d", c10dAddrs[0], freePortPair(t, c10dAddrs[0]))
	agents, out := guardedJob(t, secret, c10dAddrs, "--rdzv-backend=c10d", "--rdzv-endpoint="+endpoint)
	requireRefused(t, endpoint, secret)
	release(t, agents, out)
}
