package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
)

// metricsWait bounds how long the job and Prometheus get to show every
// rank's step.
const metricsWait = 90 * time.Second

// TestPrometheusScrapesAgents: two agents of a running embedded-trainer
// job serve --metrics-addr; a real Prometheus scrapes both and its HTTP
// API returns the step of every rank; promtool accepts what an agent
// serves.
func TestPrometheusScrapesAgents(t *testing.T) {
	prometheus, err := exec.LookPath("prometheus")
	if err != nil {
		testutil.SkipOrFail(t, "prometheus not found: apt-get install prometheus")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testutil.SkipOrFail(t, "promtool not found: apt-get install prometheus")
	}
	ports, err := testutil.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	masterPort, promPort := ports[0], ports[1]
	agents := []string{fmt.Sprintf("127.0.0.1:%d", ports[2]), fmt.Sprintf("127.0.0.1:%d", ports[3])}

	toml := trainerToml(t)
	sets := append(append([]string{}, trainerSets...), "--set", "train.steps=1000000", "--set", "train.log_every=1000")
	for node, addr := range agents {
		args := append([]string{"--nnodes=2", fmt.Sprintf("--node-rank=%d", node), "--master-addr=127.0.0.1",
			fmt.Sprintf("--master-port=%d", masterPort), "--nproc-per-node=2", "--rdzv-id=prom-e2e",
			"--node-name=" + fmt.Sprintf("node%d", node), "--metrics-addr=" + addr, toml}, sets...)
		startGorun(t, fmt.Sprintf("node%d", node), nil, args...)
	}
	startPrometheus(t, prometheus, promPort, agents)

	api := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query?query=%s", promPort, url.QueryEscape(`gorun_worker_step{run_id="prom-e2e"} > 0`))
	var steps map[string]string
	deadline := time.Now().Add(metricsWait)
	for steps = queryByRank(t, api); len(steps) < 4; steps = queryByRank(t, api) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v, Prometheus returns steps for ranks %v, want 0..3", metricsWait, steps)
		}
		time.Sleep(250 * time.Millisecond) // the scrape interval: polling, not waiting for an effect
	}
	t.Logf("Prometheus: step by rank %v", steps)

	text := httpGet(t, "http://"+agents[1]+"/metrics")
	for _, want := range []string{`gorun_worker_loss{local_rank="0",node="node1",rank="2",run_id="prom-e2e"}`,
		`gorun_agent_state{node="node1",run_id="prom-e2e",state="running"} 1`} {
		if !strings.Contains(text, want) {
			t.Errorf("node1's /metrics lacks %s:\n%s", want, text)
		}
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(text)
	if out, err := check.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// startPrometheus runs a Prometheus on 127.0.0.1:port that scrapes
// targets every 250 ms, with its data in a temporary directory; t's
// cleanup stops it.
func startPrometheus(t *testing.T, bin string, port int, targets []string) {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 250ms
  scrape_timeout: 200ms
scrape_configs:
  - job_name: gorun
    static_configs:
      - targets: ['%s']
`, strings.Join(targets, "', '"))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	log := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("prometheus log:\n%s", harness.Tail(log.String(), 40))
		}
	})
}

// queryByRank runs an instant query and returns its series' values by
// their rank label; nil while Prometheus does not answer yet.
func queryByRank(t *testing.T, api string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil // not listening yet
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil || body.Status != "success" {
		return nil // starting up
	}
	out := map[string]string{}
	for _, r := range body.Data.Result {
		out[r.Metric["rank"]] = fmt.Sprint(r.Value[1])
	}
	return out
}

// httpGet returns the body of url, failing t on any error.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}
