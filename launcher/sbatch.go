package launcher

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// SbatchSignalLead is how long before the time limit the batch script asks
// SLURM to send SIGUSR1 (--signal=USR1@120): gorun passes it on to the
// workers, which can checkpoint while they still have time.
const SbatchSignalLead = 120 * time.Second

// Sbatch is what `gorun sbatch` renders a batch script from: one gorun
// agent per node under srun, workers per GPU (GPUsPerNode) or a given
// count (NProcPerNode).
type Sbatch struct {
	Entrypoint   string // train.toml, script.py or a program, as the job will name it
	Nodes        int    // nodes allocated (--nodes=N), >= 1
	MinNodes     int    // 0: gorun's SLURM default (SLURMNodes); Nodes: a fixed size (--nnodes=Nodes); 1..Nodes-1: --nnodes=MinNodes:Nodes
	GPUsPerNode  int    // --gpus-per-node=G and gorun --nproc-per-node=gpu; 0: none
	NProcPerNode string // gorun --nproc-per-node (N, auto, cpu); "" when GPUsPerNode is set
	Time         string // SLURM time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
	Partition    string // --partition; "" is the cluster's default
	JobName      string // --job-name; "" is the entrypoint's base name without extension
	OutputDir    string // the job's output goes to OutputDir/%x-%j.out ("" is the submit directory)
	Gorun        string // the gorun binary every node runs
	// MaxRestarts is gorun's --max-restarts; -1 is the default: for an
	// elastic range one restart per node the job may lose (a dying node's
	// peers often fail before its lease expires, which spends a restart),
	// else gorun's own default.
	MaxRestarts int
	// MetricsPort, when not 0, makes every node's gorun serve its
	// Prometheus metrics on all of the node's interfaces at this port
	// (--metrics-addr=0.0.0.0:PORT); one gorun per node, so one port fits all.
	MetricsPort int
	GorunFlags  []string // more gorun flags, put before the entrypoint
	Env         []string // KEY=VALUE exported before srun
	RenderedBy  string   // the command that rendered the script, for its header
}

// Validate reports the first problem in s as a *UsageError that names
// the flag to change.
func (s Sbatch) Validate() error {
	switch {
	case s.Entrypoint == "":
		return usagef("sbatch: no entrypoint: gorun sbatch train.toml|script.py --nodes N --nproc-per-node P --time T")
	case s.Nodes < 1:
		return usagef("sbatch: --nodes=%d: want 1 or more", s.Nodes)
	case s.MinNodes < 0 || s.MinNodes > s.Nodes:
		return usagef("sbatch: --min-nodes=%d: want 1..%d (--nodes)", s.MinNodes, s.Nodes)
	case s.GPUsPerNode < 0:
		return usagef("sbatch: --gpus-per-node=%d: want 1 or more", s.GPUsPerNode)
	case s.GPUsPerNode > 0 && s.NProcPerNode != "":
		return usagef("sbatch: give --gpus-per-node (one worker per GPU) or --nproc-per-node, not both")
	case s.GPUsPerNode == 0 && s.NProcPerNode == "":
		return usagef("sbatch: give --gpus-per-node G (one worker per GPU) or --nproc-per-node P")
	case s.Time == "":
		return usagef("sbatch: give --time T, the time limit (minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S)")
	case s.Gorun == "":
		return usagef("sbatch: no gorun binary: give --gorun PATH")
	case s.MaxRestarts < -1:
		return usagef("sbatch: --max-restarts=%d: want 0 or more", s.MaxRestarts)
	case s.MetricsPort < 0 || s.MetricsPort > 65535:
		return usagef("sbatch: --metrics-port=%d: want a port 1-65535", s.MetricsPort)
	}
	if s.NProcPerNode != "" {
		switch strings.ToLower(s.NProcPerNode) {
		case "auto", "cpu":
		case "gpu":
			return usagef("sbatch: --nproc-per-node=gpu: give --gpus-per-node G instead, so that SLURM allocates the GPUs")
		default:
			if n, err := strconv.Atoi(s.NProcPerNode); err != nil || n < 1 {
				return usagef("sbatch: --nproc-per-node=%s: want a number of workers >= 1, auto or cpu", s.NProcPerNode)
			}
		}
	}
	if _, err := ParseSlurmTime(s.Time); err != nil {
		return err
	}
	for _, f := range []struct{ flag, value string }{
		{"--partition", s.Partition}, {"--job-name", s.JobName}, {"--output", s.OutputDir},
	} {
		if strings.ContainsAny(f.value, " \t\r\n\"'\\") {
			return usagef("sbatch: %s=%q: an #SBATCH line cannot hold spaces, quotes or backslashes", f.flag, f.value)
		}
	}
	for _, kv := range s.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !isShellName(k) {
			return usagef("sbatch: --env %q: want NAME=VALUE with NAME of letters, digits and _", kv)
		}
	}
	return nil
}

// Render returns the batch script of s, or s.Validate's error. The
// script's own arguments ("$@": sbatch job.sbatch ARGS...) are passed on
// to the entrypoint.
func (s Sbatch) Render() (string, error) {
	if err := s.Validate(); err != nil {
		return "", err
	}
	name := s.JobName
	if name == "" {
		name = strings.TrimSuffix(path.Base(s.Entrypoint), path.Ext(s.Entrypoint))
	}
	var b strings.Builder
	b.WriteString("#!/bin/bash\n")
	if s.RenderedBy != "" {
		fmt.Fprintf(&b, "# Rendered by: %s\n", strings.ReplaceAll(s.RenderedBy, "\n", " "))
	}
	b.WriteString("# Submit with: sbatch THIS_FILE [ARGS...]  (ARGS go to the entrypoint; relative paths are\n" +
		"# relative to the directory sbatch runs in). One gorun per node starts the workers; --no-kill\n" +
		"# keeps the job when a node dies, so gorun goes on with the nodes left.\n")
	sb := func(opt string) { b.WriteString("#SBATCH " + opt + "\n") }
	sb("--job-name=" + name)
	sb("--nodes=" + strconv.Itoa(s.Nodes))
	sb("--ntasks-per-node=1")
	if s.GPUsPerNode > 0 {
		sb("--gpus-per-node=" + strconv.Itoa(s.GPUsPerNode))
	}
	sb("--time=" + s.Time)
	if s.Partition != "" {
		sb("--partition=" + s.Partition)
	}
	sb("--requeue")
	sb("--no-kill")
	sb(fmt.Sprintf("--signal=USR1@%d", int(SbatchSignalLead.Seconds())))
	sb("--output=" + path.Join(s.OutputDir, "%x-%j.out"))
	b.WriteString("\n")
	for _, kv := range s.Env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, ShellQuote(v))
	}
	b.WriteString(secretLines(s.Gorun, s.Env))
	nproc := s.NProcPerNode
	if s.GPUsPerNode > 0 {
		nproc = "gpu"
	}
	argv := []string{"srun", "--ntasks-per-node=1", "--no-kill", "--kill-on-bad-exit=0", s.Gorun, "--nproc-per-node=" + nproc}
	elastic := s.MinNodes > 0 && s.MinNodes < s.Nodes
	switch {
	case elastic:
		argv = append(argv, fmt.Sprintf("--nnodes=%d:%d", s.MinNodes, s.Nodes))
	case s.MinNodes == s.Nodes && s.Nodes > 1:
		// Without --nnodes a job goes on with the nodes left (SLURMNodes).
		argv = append(argv, fmt.Sprintf("--nnodes=%d", s.Nodes))
	}
	restarts := s.MaxRestarts
	if restarts == -1 && elastic {
		restarts = s.Nodes - s.MinNodes
	}
	if restarts > 0 {
		argv = append(argv, fmt.Sprintf("--max-restarts=%d", restarts))
	}
	if s.MetricsPort > 0 {
		argv = append(argv, fmt.Sprintf("--metrics-addr=0.0.0.0:%d", s.MetricsPort))
	}
	argv = append(argv, s.GorunFlags...)
	argv = append(argv, s.Entrypoint)
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = ShellQuote(a)
	}
	fmt.Fprintf(&b, "%s \"$@\"\n", strings.Join(quoted, " "))
	return b.String(), nil
}

// ParseSlurmTime parses a SLURM time limit (M, M:S, H:M:S, D-H, D-H:M or
// D-H:M:S) into a duration; anything else, or no time at all, is a
// *UsageError.
func ParseSlurmTime(s string) (time.Duration, error) {
	bad := usagef("sbatch: --time=%q: want minutes (30), M:S, H:M:S, D-H, D-H:M or D-H:M:S, more than 0", s)
	days, clock, hasDays := strings.Cut(s, "-")
	if !hasDays {
		clock, days = days, ""
	}
	parts := strings.Split(clock, ":")
	nums := make([]int64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 || p == "" || p[0] == '+' {
			return 0, bad
		}
		nums[i] = n
	}
	var d, h, m, sec int64
	if hasDays {
		n, err := strconv.ParseInt(days, 10, 32)
		if err != nil || n < 0 || days[0] == '+' {
			return 0, bad
		}
		d = n
		switch len(nums) { // D-H, D-H:M, D-H:M:S
		case 1:
			h = nums[0]
		case 2:
			h, m = nums[0], nums[1]
		case 3:
			h, m, sec = nums[0], nums[1], nums[2]
		default:
			return 0, bad
		}
	} else {
		switch len(nums) { // M, M:S, H:M:S
		case 1:
			m = nums[0]
		case 2:
			m, sec = nums[0], nums[1]
		case 3:
			h, m, sec = nums[0], nums[1], nums[2]
		default:
			return 0, bad
		}
	}
	total := time.Duration(((d*24+h)*60+m)*60+sec) * time.Second
	if total <= 0 {
		return 0, bad
	}
	return total, nil
}

// ShellQuote returns s as one word for a POSIX shell: unchanged when it is
// made only of safe characters, else in single quotes.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func isShellName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
