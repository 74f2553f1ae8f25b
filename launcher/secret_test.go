package launcher

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/jobsecret"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func TestResolveSecret(t *testing.T) {
	dir := t.TempDir()
	private := filepath.Join(dir, "private")
	require.NoError(t, os.WriteFile(private, []byte(testSecret+"\n"), 0o600))
	shared := filepath.Join(dir, "shared")
	require.NoError(t, os.WriteFile(shared, []byte(testSecret), 0o644))
	require.NoError(t, os.Chmod(shared, 0o644))
	multi := func(o *Options) { o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 0, "head", 29500 }

	tests := []struct {
		name   string
		env    map[string]string
		mod    func(*Options)
		source string // "" when an error is expected
		secret string // the secret workers get; "new": a fresh one; "": none
		err    string
	}{
		{name: "from the environment", env: map[string]string{jobsecret.EnvVar: testSecret}, mod: multi, source: "GORUN_JOB_SECRET", secret: testSecret},
		{name: "from a file", mod: func(o *Options) { multi(o); o.JobSecretFile = private }, source: "--job-secret-file " + private, secret: testSecret},
		{name: "one node makes its own", source: "made for this one-node launch", secret: "new"},
		{name: "several nodes without one", mod: multi, source: "none"},
		{name: "several SLURM nodes without one", env: slurmStep(), source: "none"},
		{name: "malformed", env: map[string]string{jobsecret.EnvVar: "abc"}, err: "GORUN_JOB_SECRET: 3 hex digits"},
		{name: "empty", env: map[string]string{jobsecret.EnvVar: ""}, err: "GORUN_JOB_SECRET: empty"},
		{name: "file readable by others", mod: func(o *Options) { o.JobSecretFile = shared }, err: "chmod 600 " + shared},
		{name: "missing file", mod: func(o *Options) { o.JobSecretFile = filepath.Join(dir, "none") }, err: "--job-secret-file: job secret file: open"},
		{name: "both", env: map[string]string{jobsecret.EnvVar: testSecret}, mod: func(o *Options) { o.JobSecretFile = private }, err: "give one of them"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Resolve(opts(tc.mod), fakeHost(tc.env))
			if tc.err != "" {
				var usage *UsageError
				require.ErrorAs(t, err, &usage)
				require.ErrorContains(t, err, tc.err)
				require.NotContains(t, err.Error(), testSecret)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.source, l.SecretSource)
			got, set := lookupEnv(l.Environ, jobsecret.EnvVar)
			switch tc.secret {
			case "":
				require.False(t, set, "no secret for the workers")
				require.True(t, l.Unauthenticated())
			case "new":
				require.Regexp(t, "^[0-9a-f]{64}$", got)
				require.Equal(t, got, l.Secret.Encode())
			default:
				require.Equal(t, tc.secret, got)
			}
			if tc.secret != "" {
				require.Equal(t, 1, strings.Count(strings.Join(l.Environ, "\n"), jobsecret.EnvVar+"="), "set once")
			}
		})
	}
}

func TestRedact(t *testing.T) {
	l, err := Resolve(opts(func(o *Options) { o.RdzvConf = "user=alice,password=hunter2" }),
		fakeHost(map[string]string{jobsecret.EnvVar: testSecret, "GORUN_RDZV_CONF": "password=hunter2,user=alice",
			"MY_API_TOKEN": "tok123", "HOME": "/home/alice"}))
	require.NoError(t, err)
	l.PlanEnv()
	l.Redact()
	out, err := json.Marshal(l)
	require.NoError(t, err)
	for _, secret := range []string{"hunter2", testSecret, "tok123"} {
		require.NotContains(t, string(out), secret)
	}
	require.Contains(t, string(out), `"password":"[redacted]"`)
	require.Contains(t, string(out), `GORUN_RDZV_CONF=password=[redacted],user=alice`)
	require.Contains(t, string(out), `HOME=/home/alice`)
	require.Contains(t, string(out), `"job_secret":"GORUN_JOB_SECRET"`)
}

// Which etcd rendezvous the job secret opens: gorun's (embedded, c10d,
// or an endpoint such as gorun rendezvous serve) unless --rdzv-conf
// names a user or a client certificate; never an etcd another agent
// cannot know the secret of.
func TestResolveRendezvousCredentials(t *testing.T) {
	withSecret := func(env map[string]string) map[string]string {
		out := map[string]string{jobsecret.EnvVar: testSecret}
		for k, v := range env {
			out[k] = v
		}
		return out
	}
	endpoint := func(o *Options) {
		o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID = "2", "etcd", "10.0.0.1:2379", "j"
	}
	tests := []struct {
		name     string
		env      map[string]string
		mod      func(*Options)
		wantUser string // "": the secret gives no credentials
	}{
		{"embedded under SLURM", withSecret(slurmStep()), nil, "gorun"},
		{"an endpoint", withSecret(nil), endpoint, "gorun"},
		{"a c10d endpoint", withSecret(nil), func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID = "2", "c10d", "10.0.0.1:29400", "j"
		}, "gorun"},
		{"--rdzv-conf user", withSecret(nil), func(o *Options) { endpoint(o); o.RdzvConf = "user=alice,password=pw" }, "alice"},
		{"--rdzv-conf cert", withSecret(nil), func(o *Options) { endpoint(o); o.RdzvConf = "cert=c.pem,key=k.pem" }, ""},
		{"no secret", slurmStep(), nil, ""},
		{"static", withSecret(nil), func(o *Options) { o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 0, "head", 29500 }, ""},
		{"a one-node secret and an endpoint", nil, func(o *Options) { endpoint(o); o.NNodes = "1" }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Resolve(opts(tc.mod), fakeHost(tc.env))
			require.NoError(t, err)
			r := l.Rendezvous
			require.Equal(t, tc.wantUser, r.Client.User)
			if tc.wantUser != "gorun" {
				require.Empty(t, r.Auth)
				return
			}
			require.Equal(t, "job secret (etcd user gorun)", r.Auth)
			require.Regexp(t, "^[0-9a-f]{64}$", r.Client.Password)
			require.NotContains(t, r.Client.Password, testSecret)
			out, err := json.Marshal(l)
			require.NoError(t, err)
			require.NotContains(t, string(out), r.Client.Password, "the plan never shows the password")
		})
	}
}
