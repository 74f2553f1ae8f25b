package launcher

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func sbatchSpec(mod func(*Sbatch)) Sbatch {
	s := Sbatch{Entrypoint: "train.py", Nodes: 2, NProcPerNode: "4", Time: "30", Gorun: "/opt/bin/gorun", MaxRestarts: -1}
	if mod != nil {
		mod(&s)
	}
	return s
}

func TestSbatchRender(t *testing.T) {
	tests := []struct {
		name string
		spec Sbatch
		want []string // lines that must appear, in order
		not  []string // substrings that must not appear
	}{
		{
			name: "cpu workers",
			spec: sbatchSpec(nil),
			want: []string{
				"#!/bin/bash",
				"#SBATCH --job-name=train",
				"#SBATCH --nodes=2",
				"#SBATCH --ntasks-per-node=1",
				"#SBATCH --time=30",
				"#SBATCH --requeue",
				"#SBATCH --no-kill",
				"#SBATCH --signal=USR1@120",
				"#SBATCH --output=%x-%j.out",
				`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=4 train.py "$@"`,
			},
			not: []string{"--gpus-per-node", "--partition", "--nnodes", "--max-restarts", "# Rendered by"},
		},
		{
			name: "gpus, partition, name, output dir, header",
			spec: sbatchSpec(func(s *Sbatch) {
				s.NProcPerNode, s.GPUsPerNode = "", 8
				s.Partition, s.JobName, s.OutputDir = "gpu", "llm-7b", "/scratch/logs"
				s.Entrypoint, s.Nodes, s.Time = "examples/train.toml", 4, "1-12:00:00"
				s.RenderedBy = "gorun sbatch examples/train.toml --nodes 4"
			}),
			want: []string{
				"# Rendered by: gorun sbatch examples/train.toml --nodes 4",
				"#SBATCH --job-name=llm-7b",
				"#SBATCH --nodes=4",
				"#SBATCH --gpus-per-node=8",
				"#SBATCH --time=1-12:00:00",
				"#SBATCH --partition=gpu",
				"#SBATCH --output=/scratch/logs/%x-%j.out",
				`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=gpu examples/train.toml "$@"`,
			},
		},
		{
			name: "elastic range, extra flags and env, quoting",
			spec: sbatchSpec(func(s *Sbatch) {
				s.Nodes, s.MinNodes = 3, 2
				s.Gorun = "/home/a b/gorun"
				s.GorunFlags = []string{"--rdzv-conf=lease_ttl=5,last_call_timeout=10", "--log-dir", "it's"}
				s.Env = []string{"PYTHON=/usr/bin/python3", "NOTE=a b", "EMPTY="}
			}),
			want: []string{
				"#SBATCH --nodes=3",
				"export PYTHON=/usr/bin/python3",
				"export NOTE='a b'",
				"export EMPTY=''",
				`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 '/home/a b/gorun' --nproc-per-node=4 --nnodes=2:3 --max-restarts=1 --rdzv-conf=lease_ttl=5,last_call_timeout=10 --log-dir 'it'\''s' train.py "$@"`,
			},
		},
		{
			name: "min nodes equal to nodes is a fixed size",
			spec: sbatchSpec(func(s *Sbatch) { s.MinNodes = 2 }),
			want: []string{`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=4 --nnodes=2 train.py "$@"`},
			not:  []string{"--max-restarts"},
		},
		{
			name: "elastic restarts default to the nodes the job may lose",
			spec: sbatchSpec(func(s *Sbatch) { s.Nodes, s.MinNodes = 8, 5 }),
			want: []string{`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=4 --nnodes=5:8 --max-restarts=3 train.py "$@"`},
		},
		{
			name: "explicit restarts",
			spec: sbatchSpec(func(s *Sbatch) { s.MaxRestarts = 5 }),
			want: []string{`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=4 --max-restarts=5 train.py "$@"`},
		},
		{
			name: "metrics on every node at one port",
			spec: sbatchSpec(func(s *Sbatch) { s.MetricsPort = 9400 }),
			want: []string{`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 /opt/bin/gorun --nproc-per-node=4 --metrics-addr=0.0.0.0:9400 train.py "$@"`},
		},
		{
			name: "explicit zero restarts on an elastic range",
			spec: sbatchSpec(func(s *Sbatch) { s.Nodes, s.MinNodes, s.MaxRestarts = 3, 2, 0 }),
			not:  []string{"--max-restarts"},
		},
		{
			name: "a fresh job secret made when the job starts, before srun",
			spec: sbatchSpec(func(s *Sbatch) { s.Gorun = "/home/a b/gorun" }),
			want: []string{
				`GORUN_JOB_SECRET="$('/home/a b/gorun' job-secret)" || exit 1`,
				"export GORUN_JOB_SECRET",
				`srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 '/home/a b/gorun' --nproc-per-node=4 train.py "$@"`,
			},
		},
		{
			name: "a job secret given with --env is kept",
			spec: sbatchSpec(func(s *Sbatch) { s.Env = []string{"GORUN_JOB_SECRET=" + testSecret} }),
			want: []string{"export GORUN_JOB_SECRET=" + testSecret},
			not:  []string{"job-secret)"},
		},
		{
			name: "job name from a program path",
			spec: sbatchSpec(func(s *Sbatch) { s.Entrypoint = "/usr/local/bin/trainer" }),
			want: []string{"#SBATCH --job-name=trainer"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script, err := tt.spec.Render()
			require.NoError(t, err)
			lines := strings.Split(script, "\n")
			require.Equal(t, "#!/bin/bash", lines[0])
			at := 0
			for _, want := range tt.want {
				found := false
				for ; at < len(lines); at++ {
					if lines[at] == want {
						found = true
						break
					}
				}
				require.True(t, found, "line %q missing or out of order in:\n%s", want, script)
			}
			for _, not := range tt.not {
				require.NotContains(t, script, not)
			}
			require.True(t, strings.HasSuffix(script, "\"$@\"\n"), "the srun line ends the script:\n%s", script)
		})
	}
}

func TestSbatchValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Sbatch)
		want string // in the message
	}{
		{"no entrypoint", func(s *Sbatch) { s.Entrypoint = "" }, "no entrypoint"},
		{"zero nodes", func(s *Sbatch) { s.Nodes = 0 }, "--nodes=0"},
		{"negative nodes", func(s *Sbatch) { s.Nodes = -3 }, "--nodes=-3"},
		{"min above nodes", func(s *Sbatch) { s.MinNodes = 3 }, "--min-nodes=3"},
		{"both gpus and nproc", func(s *Sbatch) { s.GPUsPerNode = 8 }, "not both"},
		{"neither gpus nor nproc", func(s *Sbatch) { s.NProcPerNode = "" }, "--gpus-per-node G"},
		{"nproc gpu", func(s *Sbatch) { s.NProcPerNode = "gpu" }, "give --gpus-per-node"},
		{"nproc zero", func(s *Sbatch) { s.NProcPerNode = "0" }, "--nproc-per-node=0"},
		{"nproc word", func(s *Sbatch) { s.NProcPerNode = "many" }, "--nproc-per-node=many"},
		{"no time", func(s *Sbatch) { s.Time = "" }, "--time"},
		{"bad time", func(s *Sbatch) { s.Time = "1h" }, `--time="1h"`},
		{"zero time", func(s *Sbatch) { s.Time = "0" }, "--time"},
		{"no gorun", func(s *Sbatch) { s.Gorun = "" }, "--gorun"},
		{"negative restarts", func(s *Sbatch) { s.MaxRestarts = -2 }, "--max-restarts=-2"},
		{"metrics port out of range", func(s *Sbatch) { s.MetricsPort = 70000 }, "--metrics-port=70000"},
		{"space in partition", func(s *Sbatch) { s.Partition = "a b" }, "--partition"},
		{"newline in job name", func(s *Sbatch) { s.JobName = "a\n#SBATCH --x" }, "--job-name"},
		{"bad env", func(s *Sbatch) { s.Env = []string{"1X=2"} }, "--env"},
		{"env without value", func(s *Sbatch) { s.Env = []string{"PYTHON"} }, "--env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := sbatchSpec(tt.mod).Render()
			require.Error(t, err)
			var usage *UsageError
			require.True(t, errors.As(err, &usage), "want a *UsageError, got %T", err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

func TestParseSlurmTime(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30", 30 * time.Minute, true},
		{"90", 90 * time.Minute, true},
		{"10:30", 10*time.Minute + 30*time.Second, true},
		{"2:00:00", 2 * time.Hour, true},
		{"1-0", 24 * time.Hour, true},
		{"1-2:30", 26*time.Hour + 30*time.Minute, true},
		{"2-03:04:05", 51*time.Hour + 4*time.Minute + 5*time.Second, true},
		{"0:30", 30 * time.Second, true},
		{"", 0, false},
		{"0", 0, false},
		{"0-0:0:0", 0, false},
		{"-5", 0, false},
		{"1h", 0, false},
		{"1:2:3:4", 0, false},
		{"1-2:3:4:5", 0, false},
		{"a-1", 0, false},
		{"+5", 0, false},
		{"1::2", 0, false},
		{"UNLIMITED", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSlurmTime(tt.in)
			if !tt.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestShellQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"train.py", "train.py"},
		{"--set=a.b=1", "--set=a.b=1"},
		{"", "''"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"$HOME", "'$HOME'"},
		{"*.py", "'*.py'"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, ShellQuote(tt.in), tt.in)
	}
}
