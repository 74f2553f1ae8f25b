package slurm

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mapEnv is a lookup function over a map, for FromEnv.
func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// stepEnv is task 1 of a two-node, two-task step: a base for table cases.
func stepEnv() map[string]string {
	return map[string]string{
		"SLURM_JOB_ID":              "77",
		"SLURM_STEP_ID":             "0",
		"SLURM_JOB_NODELIST":        "gpu[01-04]",
		"SLURM_NODELIST":            "gpu[01-04]",
		"SLURM_JOB_NUM_NODES":       "4",
		"SLURM_STEP_NODELIST":       "gpu[02-03]",
		"SLURM_STEP_NUM_NODES":      "2",
		"SLURM_NNODES":              "2",
		"SLURM_NODEID":              "1",
		"SLURM_PROCID":              "1",
		"SLURM_LOCALID":             "0",
		"SLURM_STEP_NUM_TASKS":      "2",
		"SLURM_NTASKS":              "2",
		"SLURM_STEP_TASKS_PER_NODE": "1(x2)",
		"SLURM_TASKS_PER_NODE":      "1(x2)",
		"SLURMD_NODENAME":           "gpu03",
	}
}

// with returns a copy of m with changes applied; an empty value deletes the key.
func with(m map[string]string, changes ...string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i < len(changes); i += 2 {
		if changes[i+1] == "" {
			delete(out, changes[i])
		} else {
			out[changes[i]] = changes[i+1]
		}
	}
	return out
}

func TestFromEnvNotUnderSlurm(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"empty":          {},
		"no job id":      with(stepEnv(), "SLURM_JOB_ID", ""),
		"empty job id":   {"SLURM_JOB_ID": "", "SLURM_NODELIST": "n1"},
		"only nodelist":  {"SLURM_NODELIST": "n[1-2]"},
		"other variable": {"HOME": "/root"},
	} {
		t.Run(name, func(t *testing.T) {
			job, ok, err := FromEnv(mapEnv(env))
			require.NoError(t, err)
			require.False(t, ok)
			require.Equal(t, Job{}, job)
		})
	}
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want Job
	}{
		{
			name: "step wins over job",
			env:  stepEnv(),
			want: Job{JobID: "77", StepID: "0", Nodes: []string{"gpu02", "gpu03"},
				JobNodes: []string{"gpu01", "gpu02", "gpu03", "gpu04"}, NodeID: 1, NumNodes: 2, ProcID: 1,
				NumTasks: 2, TasksPerNode: []int{1, 1}, Hostname: "gpu03"},
		},
		{
			name: "old names",
			env: map[string]string{"SLURM_JOBID": "5", "SLURM_STEPID": "2", "SLURM_NODELIST": "n[1-3]",
				"SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_NPROCS": "6", "SLURM_PROCID": "5",
				"SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_LOCALID": "1"},
			want: Job{JobID: "5", StepID: "2", Nodes: []string{"n1", "n2", "n3"}, JobNodes: []string{"n1", "n2", "n3"},
				NodeID: 2, NumNodes: 3, ProcID: 5, LocalID: 1, NumTasks: 6, TasksPerNode: []int{2, 2, 2}},
		},
		{
			name: "batch script: no step variables",
			env: map[string]string{"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_JOB_NUM_NODES": "2",
				"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
				"SLURM_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "a1"},
			want: Job{JobID: "9", Nodes: []string{"a1", "a2"}, JobNodes: []string{"a1", "a2"}, NumNodes: 2,
				NumTasks: 4, TasksPerNode: []int{2, 2}, Hostname: "a1"},
		},
		{
			name: "only a job id",
			env:  map[string]string{"SLURM_JOB_ID": "1"},
			want: Job{JobID: "1"},
		},
		{
			name: "node count without nodelist",
			env:  map[string]string{"SLURM_JOB_ID": "1", "SLURM_NNODES": "3", "SLURM_NODEID": "2"},
			want: Job{JobID: "1", NumNodes: 3, NodeID: 2},
		},
		{
			name: "node count from the nodelist",
			env:  map[string]string{"SLURM_JOB_ID": "1", "SLURM_NODELIST": "n[1-3]", "SLURM_NODEID": "2"},
			want: Job{JobID: "1", Nodes: []string{"n1", "n2", "n3"}, JobNodes: []string{"n1", "n2", "n3"},
				NumNodes: 3, NodeID: 2},
		},
		{
			name: "empty values count as unset",
			env: with(stepEnv(), "SLURM_STEP_NODELIST", "", "SLURM_STEP_NUM_NODES", "", "SLURM_NNODES", "",
				"SLURM_STEP_TASKS_PER_NODE", "", "SLURM_TASKS_PER_NODE", "", "SLURM_NODEID", "3",
				"SLURM_JOB_GPUS", "", "SLURM_CPUS_PER_TASK", ""),
			want: Job{JobID: "77", StepID: "0", Nodes: []string{"gpu01", "gpu02", "gpu03", "gpu04"},
				JobNodes: []string{"gpu01", "gpu02", "gpu03", "gpu04"}, NodeID: 3, NumNodes: 4, ProcID: 1,
				NumTasks: 2, Hostname: "gpu03"},
		},
		{
			name: "GPUs, CPUs, requeue and end time",
			env: with(stepEnv(), "SLURM_STEP_GPUS", "2,3", "SLURM_JOB_GPUS", "0,1,2,3", "SLURM_GPUS_ON_NODE", "2",
				"SLURM_CPUS_PER_TASK", "8", "SLURM_CPUS_ON_NODE", "16", "SLURM_RESTART_COUNT", "3",
				"SLURM_JOB_END_TIME", "1767225600"),
			want: Job{JobID: "77", StepID: "0", Nodes: []string{"gpu02", "gpu03"},
				JobNodes: []string{"gpu01", "gpu02", "gpu03", "gpu04"}, NodeID: 1, NumNodes: 2, ProcID: 1,
				NumTasks: 2, TasksPerNode: []int{1, 1}, Hostname: "gpu03", GPUs: []string{"2", "3"}, GPUsOnNode: 2,
				CPUsPerTask: 8, CPUsOnNode: 16, RestartCount: 3, EndTime: time.Unix(1767225600, 0)},
		},
		{
			name: "job GPUs without step GPUs",
			env:  map[string]string{"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"},
			want: Job{JobID: "1", GPUs: []string{"0"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job, ok, err := FromEnv(mapEnv(tt.env))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, tt.want, job)
		})
	}
}

func TestFromEnvErrors(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		msg  string
	}{
		{"job id", with(stepEnv(), "SLURM_JOB_ID", "x77"),
			`slurm: SLURM_JOB_ID="x77": not a job number`},
		{"old job id", map[string]string{"SLURM_JOBID": "-1"},
			`slurm: SLURM_JOBID="-1": not a job number`},
		{"step id", with(stepEnv(), "SLURM_STEP_ID", "batch"),
			`slurm: SLURM_STEP_ID="batch": not a step number`},
		{"step nodelist", with(stepEnv(), "SLURM_STEP_NODELIST", "gpu[03-02]"),
			`slurm: SLURM_STEP_NODELIST="gpu[03-02]": invalid hostlist: range start 3 > end 2`},
		{"job nodelist", with(stepEnv(), "SLURM_JOB_NODELIST", "gpu[01-04"),
			`slurm: SLURM_JOB_NODELIST="gpu[01-04": invalid hostlist: "[" at offset 3 is never closed`},
		{"nodelist without hosts", map[string]string{"SLURM_JOB_ID": "1", "SLURM_NODELIST": ","},
			`slurm: SLURM_NODELIST=",": no hosts`},
		{"node count", with(stepEnv(), "SLURM_STEP_NUM_NODES", "two"),
			`slurm: SLURM_STEP_NUM_NODES="two": not a non-negative integer`},
		{"node count mismatch", with(stepEnv(), "SLURM_STEP_NUM_NODES", "3"),
			`slurm: SLURM_STEP_NUM_NODES="3": SLURM_STEP_NODELIST="gpu[02-03]" has 2 nodes`},
		{"node count mismatch in the batch script", map[string]string{"SLURM_JOB_ID": "1",
			"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "3"},
			`slurm: SLURM_JOB_NUM_NODES="3": SLURM_JOB_NODELIST="n[1-2]" has 2 nodes`},
		{"node id out of range", with(stepEnv(), "SLURM_NODEID", "2"),
			`slurm: SLURM_NODEID="2": node index out of range: SLURM_STEP_NODELIST="gpu[02-03]" has 2 nodes`},
		{"node id out of range of the count", map[string]string{"SLURM_JOB_ID": "1", "SLURM_NNODES": "2",
			"SLURM_NODEID": "2"},
			`slurm: SLURM_NODEID="2": node index out of range: SLURM_NNODES=2`},
		{"negative node id", with(stepEnv(), "SLURM_NODEID", "-1"),
			`slurm: SLURM_NODEID="-1": not a non-negative integer`},
		{"proc id", with(stepEnv(), "SLURM_PROCID", "1.0"),
			`slurm: SLURM_PROCID="1.0": not a non-negative integer`},
		{"proc id out of range", with(stepEnv(), "SLURM_PROCID", "2"),
			`slurm: SLURM_PROCID="2": task rank out of range: SLURM_STEP_NUM_TASKS=2`},
		{"local id", with(stepEnv(), "SLURM_LOCALID", " 0"),
			`slurm: SLURM_LOCALID=" 0": not a non-negative integer`},
		{"task count", with(stepEnv(), "SLURM_STEP_NUM_TASKS", "99999999999999999999"),
			`slurm: SLURM_STEP_NUM_TASKS="99999999999999999999": not a non-negative integer`},
		{"tasks per node", with(stepEnv(), "SLURM_STEP_TASKS_PER_NODE", "1(x2"),
			`slurm: SLURM_STEP_TASKS_PER_NODE="1(x2": item "1(x2": want N or N(xM)`},
		{"tasks per node for other nodes", with(stepEnv(), "SLURM_STEP_TASKS_PER_NODE", "1(x3)"),
			`slurm: SLURM_STEP_TASKS_PER_NODE="1(x3)": 3 entries for 2 nodes (SLURM_STEP_NUM_NODES)`},
		{"GPUs", with(stepEnv(), "SLURM_STEP_GPUS", "0,,1"),
			`slurm: SLURM_STEP_GPUS="0,,1": GPU index "" is not a number`},
		{"job GPUs", with(stepEnv(), "SLURM_JOB_GPUS", "GPU-1234"),
			`slurm: SLURM_JOB_GPUS="GPU-1234": GPU index "GPU-1234" is not a number`},
		{"GPUs on node", with(stepEnv(), "SLURM_GPUS_ON_NODE", "x"),
			`slurm: SLURM_GPUS_ON_NODE="x": not a non-negative integer`},
		{"CPUs per task", with(stepEnv(), "SLURM_CPUS_PER_TASK", "-2"),
			`slurm: SLURM_CPUS_PER_TASK="-2": not a non-negative integer`},
		{"CPUs on node", with(stepEnv(), "SLURM_CPUS_ON_NODE", "2(x2)"),
			`slurm: SLURM_CPUS_ON_NODE="2(x2)": not a non-negative integer`},
		{"restart count", with(stepEnv(), "SLURM_RESTART_COUNT", "one"),
			`slurm: SLURM_RESTART_COUNT="one": not a non-negative integer`},
		{"end time", with(stepEnv(), "SLURM_JOB_END_TIME", "2026-01-01"),
			`slurm: SLURM_JOB_END_TIME="2026-01-01": not unix seconds`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok, err := FromEnv(mapEnv(tt.env))
			require.True(t, ok)
			require.EqualError(t, err, tt.msg)
			var envErr *EnvError
			require.ErrorAs(t, err, &envErr)
		})
	}
}

func TestFromEnvNodelistErrorIsHostlistError(t *testing.T) {
	_, _, err := FromEnv(mapEnv(with(stepEnv(), "SLURM_STEP_NODELIST", "x[]")))
	var he *HostlistError
	require.ErrorAs(t, err, &he)
	require.Equal(t, "x[]", he.Expr)
}

func TestJobTasksOnThisNode(t *testing.T) {
	tests := []struct {
		name string
		job  Job
		want int
	}{
		{"from tasks per node", Job{NodeID: 1, NumNodes: 2, TasksPerNode: []int{4, 3}}, 3},
		{"single node, tasks known", Job{NumNodes: 1, NumTasks: 8}, 8},
		{"several nodes, per node unknown", Job{NodeID: 1, NumNodes: 2, NumTasks: 8}, 1},
		{"nothing known", Job{}, 1},
		{"node id beyond the list", Job{NodeID: 5, TasksPerNode: []int{2}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.job.TasksOnThisNode())
		})
	}
}

func TestJobMasterAddr(t *testing.T) {
	require.Equal(t, "n1", Job{Nodes: []string{"n1", "n2"}}.MasterAddr())
	require.Equal(t, "", Job{}.MasterAddr())
}

// readEnvFile reads a testdata/*.env file: NAME=VALUE lines, # comments.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "line %q", line)
		env[k] = v
	}
	require.NoError(t, sc.Err())
	return env
}

// TestFromEnvRealSlurm reads environments captured on the lab's SLURM 22.05 cluster
// (shared/lab/slurm-up.sh 2) with env | grep ^SLURM, minus site-specific noise.
func TestFromEnvRealSlurm(t *testing.T) {
	tests := []struct {
		file    string
		want    Job
		onNode  int
		primary string
	}{
		{
			file: "srun-N2-ntasks-per-node1.task1.env",
			want: Job{JobID: "1", StepID: "0", Nodes: []string{"node1", "node2"}, JobNodes: []string{"node1", "node2"},
				NodeID: 1, NumNodes: 2, ProcID: 1, NumTasks: 2, TasksPerNode: []int{1, 1}, Hostname: "node2",
				CPUsOnNode: 1},
			onNode: 1, primary: "node1",
		},
		{
			file: "srun-N2-n3.task2.env",
			want: Job{JobID: "2", StepID: "0", Nodes: []string{"node1", "node2"}, JobNodes: []string{"node1", "node2"},
				NodeID: 1, NumNodes: 2, ProcID: 2, NumTasks: 3, TasksPerNode: []int{2, 1}, Hostname: "node2",
				CPUsOnNode: 1},
			onNode: 1, primary: "node1",
		},
		{
			file: "srun-N2-n2-c2.task1.env",
			want: Job{JobID: "4", StepID: "0", Nodes: []string{"node1", "node2"}, JobNodes: []string{"node1", "node2"},
				NodeID: 1, NumNodes: 2, ProcID: 1, NumTasks: 2, TasksPerNode: []int{1, 1}, Hostname: "node2",
				CPUsPerTask: 2, CPUsOnNode: 2},
			onNode: 1, primary: "node1",
		},
		{
			file: "sbatch-N2-ntasks-per-node2.batch.env",
			want: Job{JobID: "3", Nodes: []string{"node1", "node2"}, JobNodes: []string{"node1", "node2"},
				NumNodes: 2, NumTasks: 4, TasksPerNode: []int{2, 2}, Hostname: "node1", CPUsOnNode: 2},
			onNode: 2, primary: "node1",
		},
		{
			// A one-node step inside a two-node job: SLURM_NODELIST still names both nodes.
			file: "sbatch-N2-substep-node2.env",
			want: Job{JobID: "3", StepID: "0", Nodes: []string{"node2"}, JobNodes: []string{"node1", "node2"},
				NumNodes: 1, NumTasks: 1, TasksPerNode: []int{1}, Hostname: "node2", CPUsOnNode: 2},
			onNode: 1, primary: "node2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			env := readEnvFile(t, filepath.Join("testdata", tt.file))
			job, ok, err := FromEnv(mapEnv(env))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, tt.want, job)
			require.Equal(t, tt.onNode, job.TasksOnThisNode())
			require.Equal(t, tt.primary, job.MasterAddr())
		})
	}
}
