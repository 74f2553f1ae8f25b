// Package distenv is the worker environment contract: the variables gorun
// gives every worker, the same ones torchrun gives, so unchanged PyTorch
// scripts using init_process_group(init_method="env://") work.
package distenv

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ExitRequeue is the exit status (EX_TEMPFAIL of sysexits.h, "try again
// later") by which a worker says it saved a checkpoint on request
// (SIGUSR1/SIGUSR2, SLURM's --signal warning, passed on by gorun) and
// stopped so the job can be requeued; gorun then exits with it too. The
// agent (elastic) and the embedded trainer's worker (trainer/worker) both
// name it; a script may exit with it as well.
const ExitRequeue = 75

// Worker is everything one worker process is told about its place in the job.
type Worker struct {
	Rank           int    `json:"rank"`             // RANK: global rank
	LocalRank      int    `json:"local_rank"`       // LOCAL_RANK: rank on this node
	WorldSize      int    `json:"world_size"`       // WORLD_SIZE: workers in the job
	LocalWorldSize int    `json:"local_world_size"` // LOCAL_WORLD_SIZE: workers on this node
	GroupRank      int    `json:"group_rank"`       // GROUP_RANK: node rank
	GroupWorldSize int    `json:"group_world_size"` // GROUP_WORLD_SIZE: nodes in the job
	RoleName       string `json:"role_name"`        // ROLE_NAME
	MasterAddr     string `json:"master_addr"`      // MASTER_ADDR: host of worker rank 0's store
	MasterPort     int    `json:"master_port"`      // MASTER_PORT
	RestartCount   int    `json:"restart_count"`    // TORCHELASTIC_RESTART_COUNT
	MaxRestarts    int    `json:"max_restarts"`     // TORCHELASTIC_MAX_RESTARTS
	RunID          string `json:"run_id"`           // TORCHELASTIC_RUN_ID
	ErrorFile      string `json:"error_file"`       // TORCHELASTIC_ERROR_FILE: where the worker may write its error as JSON
	// VisibleGPUs is CUDA_VISIBLE_DEVICES, set only where gorun was asked
	// to narrow it (torchrun's --virtual-local-rank: one GPU per worker).
	// Empty leaves the inherited value as it is: gorun never derives it.
	VisibleGPUs []string `json:"visible_gpus,omitempty"`
	// VirtualLocalRank is torchrun's --virtual-local-rank: LOCAL_RANK is
	// 0 for every worker, each of which sees only its own GPU.
	VirtualLocalRank bool `json:"virtual_local_rank,omitempty"`
}

// Validate reports the first inconsistency in w, so a bad plan never
// reaches a worker.
func (w Worker) Validate() error {
	switch {
	case w.WorldSize < 1:
		return fmt.Errorf("distenv: world size %d < 1", w.WorldSize)
	case w.Rank < 0 || w.Rank >= w.WorldSize:
		return fmt.Errorf("distenv: rank %d outside world size %d", w.Rank, w.WorldSize)
	case w.LocalRank < 0 || w.LocalRank >= w.LocalWorldSize:
		return fmt.Errorf("distenv: local rank %d outside local world size %d", w.LocalRank, w.LocalWorldSize)
	case w.GroupRank < 0 || w.GroupRank >= w.GroupWorldSize:
		return fmt.Errorf("distenv: node rank %d outside %d nodes", w.GroupRank, w.GroupWorldSize)
	case w.MasterAddr == "" || w.MasterPort <= 0 || w.MasterPort > 65535:
		return fmt.Errorf("distenv: master %s:%d is not a valid address", w.MasterAddr, w.MasterPort)
	}
	return nil
}

// Vars returns the contract's variables, sorted by name. Variables that
// only take a default (TORCH_NCCL_ASYNC_ERROR_HANDLING, PYTHONUNBUFFERED,
// and OMP_NUM_THREADS with more than one worker on the node, torchrun's
// rule) are included only when lookup does not find them.
func (w Worker) Vars(lookup func(string) (string, bool)) map[string]string {
	v := map[string]string{
		"RANK":                         strconv.Itoa(w.Rank),
		"LOCAL_RANK":                   strconv.Itoa(w.LocalRank),
		"WORLD_SIZE":                   strconv.Itoa(w.WorldSize),
		"LOCAL_WORLD_SIZE":             strconv.Itoa(w.LocalWorldSize),
		"GROUP_RANK":                   strconv.Itoa(w.GroupRank),
		"GROUP_WORLD_SIZE":             strconv.Itoa(w.GroupWorldSize),
		"ROLE_RANK":                    strconv.Itoa(w.Rank), // one role per job: role rank is the rank
		"ROLE_WORLD_SIZE":              strconv.Itoa(w.WorldSize),
		"ROLE_NAME":                    w.RoleName,
		"MASTER_ADDR":                  w.MasterAddr,
		"MASTER_PORT":                  strconv.Itoa(w.MasterPort),
		"TORCHELASTIC_RESTART_COUNT":   strconv.Itoa(w.RestartCount),
		"TORCHELASTIC_MAX_RESTARTS":    strconv.Itoa(w.MaxRestarts),
		"TORCHELASTIC_RUN_ID":          w.RunID,
		"TORCHELASTIC_USE_AGENT_STORE": "False",
		"TORCHELASTIC_ERROR_FILE":      w.ErrorFile,
	}
	if w.VirtualLocalRank {
		v["LOCAL_RANK"] = "0"
	}
	if len(w.VisibleGPUs) > 0 {
		v["CUDA_VISIBLE_DEVICES"] = strings.Join(w.VisibleGPUs, ",")
	}
	defaults := map[string]string{
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		// Workers' output is read line by line through pipes; an
		// unbuffered Python shows each line when it is printed.
		"PYTHONUNBUFFERED": "1",
	}
	if w.LocalWorldSize > 1 {
		// torchrun's rule: one thread per worker unless the user said
		// otherwise, and only when workers share the node.
		defaults["OMP_NUM_THREADS"] = "1"
	}
	for k, def := range defaults {
		if _, set := lookup(k); !set {
			v[k] = def
		}
	}
	return v
}

// Environ returns base (KEY=VALUE pairs, as os.Environ gives them) with
// the contract's variables set over it, in a stable order.
func (w Worker) Environ(base []string) []string {
	lookup := func(k string) (string, bool) {
		for _, kv := range base {
			if name, val, ok := strings.Cut(kv, "="); ok && name == k {
				return val, true
			}
		}
		return "", false
	}
	vars := w.Vars(lookup)
	out := make([]string, 0, len(base)+len(vars))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, overridden := vars[name]; !overridden {
			out = append(out, kv)
		}
	}
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		out = append(out, k+"="+vars[k])
	}
	return out
}

// FromEnv reads the contract back, as a worker does at start. Every missing
// or malformed variable is an error naming it.
func FromEnv(lookup func(string) (string, bool)) (Worker, error) {
	var w Worker
	ints := []struct {
		name string
		dst  *int
	}{
		{"RANK", &w.Rank}, {"LOCAL_RANK", &w.LocalRank}, {"WORLD_SIZE", &w.WorldSize},
		{"LOCAL_WORLD_SIZE", &w.LocalWorldSize}, {"GROUP_RANK", &w.GroupRank},
		{"GROUP_WORLD_SIZE", &w.GroupWorldSize}, {"MASTER_PORT", &w.MasterPort},
	}
	for _, f := range ints {
		s, ok := lookup(f.name)
		if !ok {
			return Worker{}, fmt.Errorf("distenv: %s is not set: start workers with gorun or torchrun", f.name)
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Worker{}, fmt.Errorf("distenv: %s=%q is not an integer", f.name, s)
		}
		*f.dst = n
	}
	optionalInts := []struct {
		name string
		dst  *int
	}{{"TORCHELASTIC_RESTART_COUNT", &w.RestartCount}, {"TORCHELASTIC_MAX_RESTARTS", &w.MaxRestarts}}
	for _, f := range optionalInts {
		if s, ok := lookup(f.name); ok {
			n, err := strconv.Atoi(s)
			if err != nil {
				return Worker{}, fmt.Errorf("distenv: %s=%q is not an integer", f.name, s)
			}
			*f.dst = n
		}
	}
	w.MasterAddr, _ = lookup("MASTER_ADDR")
	w.RoleName, _ = lookup("ROLE_NAME")
	w.RunID, _ = lookup("TORCHELASTIC_RUN_ID")
	w.ErrorFile, _ = lookup("TORCHELASTIC_ERROR_FILE")
	if s, ok := lookup("CUDA_VISIBLE_DEVICES"); ok && s != "" {
		w.VisibleGPUs = strings.Split(s, ",")
	}
	if err := w.Validate(); err != nil {
		return Worker{}, err
	}
	return w, nil
}
