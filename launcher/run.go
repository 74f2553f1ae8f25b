package launcher

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
)

// planErrorDir stands for the temporary directory of the error files in
// `gorun plan`, which creates nothing.
const planErrorDir = "$TMPDIR/gorun-XXXX"

// Runtime is what running a Launch needs from the process around it.
type Runtime struct {
	Stdout, Stderr io.Writer        // gorun's console
	Signals        <-chan os.Signal // signals gorun caught
	// GuardCommand starts the guard process that kills the workers if
	// gorun dies without stopping them (proc.RunGuard); nil: no guard.
	GuardCommand []string
	Log          zerolog.Logger
}

// Round is the one round of a static launch.
func (l *Launch) Round() elastic.Round {
	return elastic.Round{NodeRank: l.NodeRank, NumNodes: l.MinNodes, MasterAddr: l.MasterAddr, MasterPort: l.MasterPort}
}

// AgentSpec is the agent's view of l; errorDir holds the workers' error
// files when there is no log dir.
func (l *Launch) AgentSpec(rt Runtime, errorDir string) elastic.Spec {
	spec := elastic.Spec{
		RunID: l.RunID, Host: l.Host, LocalWorkers: l.NProcPerNode, Role: l.Role,
		Command: l.Command, Environ: l.Environ, MaxRestarts: l.MaxRestarts,
		TermTimeout: l.TermTimeout.Std(), ErrorDir: errorDir, Report: rt.Stderr,
		Signals: rt.Signals, Log: rt.Log,
		Logs: workerlog.Config{
			Dir: l.LogDir, Redirects: l.Redirects, Tee: l.Tee, LocalRanksFilter: l.ShowRanks,
			Stdout: rt.Stdout, Stderr: rt.Stderr, TailLines: 20,
		},
	}
	if !l.gpusInherited() {
		spec.VisibleGPUs = l.GPUs
	}
	return spec
}

// Run runs l on this node until the job ends, and returns how it ended.
// ctx ending stops the workers as SIGTERM does. Temporary files (error
// files without --log-dir) are removed before it returns.
func Run(ctx context.Context, l *Launch, rt Runtime) (elastic.Outcome, error) {
	if l.LogDir == "" && (!l.Redirects.IsZero() || !l.Tee.IsZero()) {
		dir, err := os.MkdirTemp("", "gorun-logs-")
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("log dir for --redirects/--tee: %w", err)
		}
		l.LogDir = dir
		rt.Log.Warn().Str("log_dir", dir).Msg("--redirects/--tee without --log-dir: worker logs go to a temporary directory")
	}
	errorDir := filepath.Join(l.LogDir, l.RunID)
	if l.LogDir == "" {
		tmp, err := os.MkdirTemp("", "gorun-"+l.RunID+"-")
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("directory for worker error files: %w", err)
		}
		defer os.RemoveAll(tmp)
		errorDir = tmp
	}
	spec := l.AgentSpec(rt, errorDir)
	if rt.GuardCommand != nil {
		guard, err := proc.StartGuard(rt.GuardCommand)
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, err
		}
		defer func() {
			if err := guard.Close(); err != nil {
				rt.Log.Warn().Err(err).Msg("guard process")
			}
		}()
		spec.Guard = guard
	}
	agent, err := elastic.New(spec, elastic.Static(l.Round()))
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	return agent.Run(ctx)
}

// PlanEnv fills WorkerEnv: the full environment of each local worker.
func (l *Launch) PlanEnv() {
	l.WorkerEnv = nil
	for _, w := range l.Workers {
		l.WorkerEnv = append(l.WorkerEnv, w.Environ(l.Environ))
	}
}
