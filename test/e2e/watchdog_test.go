package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// watchdogScript is an unchanged torch script that uses torchrun's file
// based watchdog: rank 1 arms a 0.5 s timer and then hangs.
const watchdogScript = `
import os, time
from torch.distributed.elastic.timer import FileTimerClient
client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"])
if os.environ["RANK"] == "1":
    client.acquire("train_step", time.time() + 0.5)
    time.sleep(60)
else:
    client.acquire("train_step", time.time() + 30)
    time.sleep(1)
    client.release("train_step")
`

// With TORCHELASTIC_ENABLE_FILE_TIMER=1 gorun serves torch's file timer
// protocol, as torchrun does: a worker whose timer expires is killed with
// the signal it asked for, and the failure says so.
func TestTorchFileTimer(t *testing.T) {
	torch.Require(t)
	script := filepath.Join(t.TempDir(), "watchdog.py")
	if err := os.WriteFile(script, []byte(watchdogScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runGorun(t, []string{"TORCHELASTIC_ENABLE_FILE_TIMER=1"}, "--standalone", "--nproc-per-node=2", script)
	if r.ExitCode != 137 {
		t.Errorf("exit %d, want 137 (SIGKILL from the expired timer)", r.ExitCode)
	}
	if !strings.Contains(r.Stderr, `watchdog timer "train_step" expired`) || !strings.Contains(r.Stderr, "first failed rank 1") {
		t.Errorf("the failure does not name rank 1's expired watchdog timer:\n%s", r.Stderr)
	}
}
