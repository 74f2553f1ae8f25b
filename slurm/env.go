package slurm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Job is what SLURM tells one task about its job and step.
//
// Inside a job step SLURM_NODELIST and SLURM_JOB_NODELIST cover the whole job while
// SLURM_NODEID and SLURM_NNODES count within the step, so the step's SLURM_STEP_*
// variables win wherever both exist. The batch script is not a step and has no
// SLURM_STEP_* variables; there the job's variables describe it.
type Job struct {
	JobID        string    `json:"job_id"`                  // SLURM_JOB_ID (or SLURM_JOBID)
	StepID       string    `json:"step_id,omitempty"`       // SLURM_STEP_ID (or SLURM_STEPID); "" outside a step (the batch script)
	Nodes        []string  `json:"nodes"`                   // the step's nodes: SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST/SLURM_NODELIST, expanded
	JobNodes     []string  `json:"job_nodes"`               // the whole job's nodes: SLURM_JOB_NODELIST, else SLURM_NODELIST, expanded
	NodeID       int       `json:"node_id"`                 // SLURM_NODEID (index into Nodes); 0 when unset
	NumNodes     int       `json:"num_nodes"`               // SLURM_STEP_NUM_NODES, else SLURM_NNODES/SLURM_JOB_NUM_NODES, else len(Nodes)
	ProcID       int       `json:"proc_id"`                 // SLURM_PROCID; 0 when unset
	LocalID      int       `json:"local_id"`                // SLURM_LOCALID; 0 when unset
	NumTasks     int       `json:"num_tasks"`               // SLURM_STEP_NUM_TASKS, else SLURM_NTASKS/SLURM_NPROCS; 0 when unknown
	TasksPerNode []int     `json:"tasks_per_node"`          // SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE, one entry per node; nil when unknown
	Hostname     string    `json:"hostname"`                // SLURMD_NODENAME
	GPUs         []string  `json:"gpus,omitempty"`          // SLURM_STEP_GPUS, else SLURM_JOB_GPUS: GPU indices on this node ("0,1,2"); nil when unset
	GPUsOnNode   int       `json:"gpus_on_node,omitempty"`  // SLURM_GPUS_ON_NODE; 0 when unset
	CPUsPerTask  int       `json:"cpus_per_task,omitempty"` // SLURM_CPUS_PER_TASK; 0 when unset (SLURM's default is 1)
	CPUsOnNode   int       `json:"cpus_on_node,omitempty"`  // SLURM_CPUS_ON_NODE; 0 when unset
	RestartCount int       `json:"restart_count"`           // SLURM_RESTART_COUNT (requeues); 0 when unset
	EndTime      time.Time `json:"end_time,omitzero"`       // SLURM_JOB_END_TIME (unix seconds); zero when unset
}

// EnvError is the error FromEnv returns for a malformed or inconsistent variable.
type EnvError struct {
	Var   string // the variable, e.g. "SLURM_NODEID"
	Value string // its value
	Err   error  // what is wrong with it
}

// Error returns `slurm: VAR="VALUE": what is wrong`.
func (e *EnvError) Error() string {
	msg := e.Err.Error()
	var he *HostlistError
	if errors.As(e.Err, &he) {
		msg = "invalid hostlist: " + he.Reason
	}
	return fmt.Sprintf("slurm: %s=%q: %s", e.Var, e.Value, msg)
}

// Unwrap returns what is wrong, a *HostlistError for a bad nodelist.
func (e *EnvError) Unwrap() error { return e.Err }

// env reads variables through a lookup function; an empty value counts as unset.
type env func(string) (string, bool)

// first returns the first of names that is set, with its value.
func (get env) first(names ...string) (name, value string, ok bool) {
	for _, n := range names {
		if v, set := get(n); set && v != "" {
			return n, v, true
		}
	}
	return "", "", false
}

// count reads the first of names that is set as a non-negative integer.
func (get env) count(dst *int, names ...string) (name string, err error) {
	name, v, ok := get.first(names...)
	if !ok {
		return "", nil
	}
	n, err := strconv.ParseUint(v, 10, strconv.IntSize-1)
	if err != nil {
		return name, &EnvError{Var: name, Value: v, Err: errors.New("not a non-negative integer")}
	}
	*dst = int(n)
	return name, nil
}

// hosts reads and expands the first of names that is set.
func (get env) hosts(dst *[]string, names ...string) (name, value string, err error) {
	name, v, ok := get.first(names...)
	if !ok {
		return "", "", nil
	}
	h, err := ExpandHostlist(v)
	if err != nil {
		return name, v, &EnvError{Var: name, Value: v, Err: err}
	}
	if len(h) == 0 {
		return name, v, &EnvError{Var: name, Value: v, Err: errors.New("no hosts")}
	}
	*dst = h
	return name, v, nil
}

// FromEnv reads the SLURM environment through lookup (os.LookupEnv in production).
// ok is false when not running under SLURM (no SLURM_JOB_ID or SLURM_JOBID); then job is
// zero and err nil. Variables set to "" count as unset. Every malformed variable is an
// *EnvError naming the variable, its value and what is wrong, and so is each of these
// inconsistencies: SLURM_NODEID not below the number of nodes, a node count that differs
// from the length of the nodelist, a tasks-per-node list with another number of entries
// than there are nodes, SLURM_PROCID not below the number of tasks. On error job holds
// what was read before it and ok is true.
func FromEnv(lookup func(string) (string, bool)) (job Job, ok bool, err error) {
	get := env(lookup)
	idName, id, ok := get.first("SLURM_JOB_ID", "SLURM_JOBID")
	if !ok {
		return Job{}, false, nil
	}
	if !allDigits(id) {
		return job, true, &EnvError{Var: idName, Value: id, Err: errors.New("not a job number")}
	}
	job.JobID = id
	if name, step, ok := get.first("SLURM_STEP_ID", "SLURM_STEPID"); ok {
		if !allDigits(step) {
			return job, true, &EnvError{Var: name, Value: step, Err: errors.New("not a step number")}
		}
		job.StepID = step
	}

	nodesVar, nodesVal, err := get.hosts(&job.Nodes, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	if err != nil {
		return job, true, err
	}
	if _, _, err := get.hosts(&job.JobNodes, "SLURM_JOB_NODELIST", "SLURM_NODELIST"); err != nil {
		return job, true, err
	}
	// SLURM_NNODES before SLURM_JOB_NUM_NODES: inside a step it counts the step's nodes.
	numNodesVar, err := get.count(&job.NumNodes, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
	if err != nil {
		return job, true, err
	}
	if job.Nodes != nil {
		if numNodesVar == "" {
			job.NumNodes = len(job.Nodes)
		} else if job.NumNodes != len(job.Nodes) {
			return job, true, &EnvError{Var: numNodesVar, Value: strconv.Itoa(job.NumNodes),
				Err: fmt.Errorf("%s=%q has %d nodes", nodesVar, nodesVal, len(job.Nodes))}
		}
	}
	nodeIDVar, err := get.count(&job.NodeID, "SLURM_NODEID")
	if err != nil {
		return job, true, err
	}
	if nodeIDVar != "" && job.NumNodes > 0 && job.NodeID >= job.NumNodes {
		what := fmt.Sprintf("%s=%d", numNodesVar, job.NumNodes)
		if job.Nodes != nil {
			what = fmt.Sprintf("%s=%q has %d nodes", nodesVar, nodesVal, len(job.Nodes))
		}
		return job, true, &EnvError{Var: nodeIDVar, Value: strconv.Itoa(job.NodeID),
			Err: fmt.Errorf("node index out of range: %s", what)}
	}

	numTasksVar, err := get.count(&job.NumTasks, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
	if err != nil {
		return job, true, err
	}
	procIDVar, err := get.count(&job.ProcID, "SLURM_PROCID")
	if err != nil {
		return job, true, err
	}
	if procIDVar != "" && numTasksVar != "" && job.ProcID >= job.NumTasks {
		return job, true, &EnvError{Var: procIDVar, Value: strconv.Itoa(job.ProcID),
			Err: fmt.Errorf("task rank out of range: %s=%d", numTasksVar, job.NumTasks)}
	}
	if _, err := get.count(&job.LocalID, "SLURM_LOCALID"); err != nil {
		return job, true, err
	}
	if name, v, ok := get.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"); ok {
		tpn, reason := parseCounts(v)
		if reason != "" {
			return job, true, &EnvError{Var: name, Value: v, Err: errors.New(reason)}
		}
		if job.NumNodes > 0 && len(tpn) != job.NumNodes {
			return job, true, &EnvError{Var: name, Value: v,
				Err: fmt.Errorf("%d entries for %d nodes (%s)", len(tpn), job.NumNodes, numNodesVarOr(numNodesVar, nodesVar))}
		}
		job.TasksPerNode = tpn
	}

	if _, host, ok := get.first("SLURMD_NODENAME"); ok {
		job.Hostname = host
	}
	if name, v, ok := get.first("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"); ok {
		gpus := strings.Split(v, ",")
		for _, g := range gpus {
			if !allDigits(g) {
				return job, true, &EnvError{Var: name, Value: v, Err: fmt.Errorf("GPU index %q is not a number", g)}
			}
		}
		job.GPUs = gpus
	}
	for _, c := range []struct {
		dst  *int
		name string
	}{
		{&job.GPUsOnNode, "SLURM_GPUS_ON_NODE"},
		{&job.CPUsPerTask, "SLURM_CPUS_PER_TASK"},
		{&job.CPUsOnNode, "SLURM_CPUS_ON_NODE"},
		{&job.RestartCount, "SLURM_RESTART_COUNT"},
	} {
		if _, err := get.count(c.dst, c.name); err != nil {
			return job, true, err
		}
	}
	if v, ok := get("SLURM_JOB_END_TIME"); ok && v != "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs < 0 {
			return job, true, &EnvError{Var: "SLURM_JOB_END_TIME", Value: v, Err: errors.New("not unix seconds")}
		}
		job.EndTime = time.Unix(secs, 0)
	}
	return job, true, nil
}

// numNodesVarOr names where a node count came from: the count variable, else the nodelist.
func numNodesVarOr(numNodesVar, nodesVar string) string {
	if numNodesVar != "" {
		return numNodesVar
	}
	return "nodes in " + nodesVar
}

// TasksOnThisNode returns how many tasks of the step run on this node: TasksPerNode[NodeID].
// When that is unknown it returns NumTasks for a single-node step, else 1, the task that
// asks.
func (j Job) TasksOnThisNode() int {
	switch {
	case j.NodeID >= 0 && j.NodeID < len(j.TasksPerNode):
		return j.TasksPerNode[j.NodeID]
	case j.NumNodes == 1 && j.NumTasks > 0:
		return j.NumTasks
	default:
		return 1
	}
}

// MasterAddr returns the first host of Nodes, where node rank 0 runs; "" when Nodes is empty.
func (j Job) MasterAddr() string {
	if len(j.Nodes) == 0 {
		return ""
	}
	return j.Nodes[0]
}
