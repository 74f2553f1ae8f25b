package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/jobsecret"
)

// `gorun plan` resolves a train.toml as the run does: with $GOROOT unset
// and no go command on PATH, examples/train.toml reads the built-in
// corpus and plans.
func TestPlanTrainTomlWithoutGOROOT(t *testing.T) {
	t.Setenv("GOROOT", "")
	require.NoError(t, os.Unsetenv("GOROOT"))
	t.Setenv("PATH", t.TempDir())
	toml, err := filepath.Abs(filepath.Join("..", "..", "examples", "train.toml"))
	require.NoError(t, err)
	code, stdout, stderr := run(t, nil, "plan", "--nproc-per-node=2", toml)
	require.Equal(t, 0, code, stderr)
	var plan struct {
		RunID   string   `json:"run_id"`
		Command []string `json:"command"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan))
	require.Regexp(t, `^gorun-[0-9a-f]{12}$`, plan.RunID, "one node: a fresh run id")
	require.Equal(t, []string{"worker", toml}, plan.Command[1:])
}

// --standalone with --master-port uses that port.
func TestPlanStandaloneMasterPort(t *testing.T) {
	code, stdout, stderr := run(t, nil, "plan", "--standalone", "--master-port=29555", "--", "true")
	require.Equal(t, 0, code, stderr)
	var plan struct {
		MasterPort int `json:"master_port"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan))
	require.Equal(t, 29555, plan.MasterPort)
}

// `gorun plan` prints neither the rendezvous password nor the job secret,
// wherever they appear (--rdzv-conf, GORUN_RDZV_CONF, the workers'
// environment).
func TestPlanRedactsSecrets(t *testing.T) {
	const secret = "00112233445566778899aabbccddeeff"
	env := map[string]string{jobsecret.EnvVar: secret, "GORUN_RDZV_CONF": "user=alice,password=hunter2"}
	code, stdout, stderr := run(t, env, "plan", "--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=127.0.0.1:2379",
		"--rdzv-id=job", "--rdzv-conf=user=alice,password=hunter2", "--", "true")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stdout, "hunter2")
	require.NotContains(t, stdout, secret)
	require.Contains(t, stdout, jobsecret.EnvVar+"="+jobsecret.Redacted)
}

// `gorun job-secret` prints a fresh secret that GORUN_JOB_SECRET takes.
func TestJobSecretCommand(t *testing.T) {
	code, first, stderr := run(t, nil, "job-secret")
	require.Equal(t, 0, code, stderr)
	_, second, _ := run(t, nil, "job-secret")
	require.NotEqual(t, first, second)
	_, err := jobsecret.Parse(first)
	require.NoError(t, err)
}

// `gorun job-secret --etcdctl DIR` writes what etcdctl needs for the
// given secret and prints the command line; it needs a secret.
func TestJobSecretEtcdctl(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcdctl")
	code, _, stderr := run(t, nil, "job-secret", "--etcdctl", dir)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "give the job's secret")

	secret, err := jobsecret.New()
	require.NoError(t, err)
	code, stdout, stderr := run(t, map[string]string{jobsecret.EnvVar: secret.Encode()},
		"job-secret", "--etcdctl", dir, "--endpoint", "10.0.0.1:30000")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "etcdctl --endpoints=https://10.0.0.1:30000 --cacert="+filepath.Join(dir, "ca.pem"))
	require.Contains(t, stdout, "--user=gorun:\"$(cat "+filepath.Join(dir, "password")+")\"")
	require.NotContains(t, stdout, secret.Encode())
	for _, name := range []string{"ca.pem", "client.pem", "client-key.pem", "password"} {
		require.FileExists(t, filepath.Join(dir, name))
	}
}
