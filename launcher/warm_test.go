package launcher

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWarmCommand(t *testing.T) {
	const warm = "/shm/python/gorun/_warm.py"
	for _, tc := range []struct {
		name string
		argv []string
		want []string
	}{
		{"a script", []string{"/usr/bin/python3", "-u", "train.py", "--lr", "1"}, []string{"/usr/bin/python3", "-u", warm, "train.py", "--lr", "1"}},
		{"a module", []string{"python3", "-u", "-m", "pkg.train", "-x"}, []string{"python3", "-u", warm, "-m", "pkg.train", "-x"}},
		{"no options", []string{"python", "t.py"}, []string{"python", warm, "t.py"}},
		{"python3.11, -W and -X with their values", []string{"/opt/python3.11", "-W", "ignore", "-Xfaulthandler", "-X", "dev", "-OO", "t.py"},
			[]string{"/opt/python3.11", "-W", "ignore", "-Xfaulthandler", "-X", "dev", "-OO", warm, "t.py"}},
		{"options joined", []string{"python3", "-uB", "t.py"}, []string{"python3", "-uB", warm, "t.py"}},
		{"--run-path: -c", []string{"python3", "-u", "-c", "import runpy", "t.py"}, nil},
		{"-E ignores PYTHONPATH", []string{"python3", "-E", "t.py"}, nil},
		{"-I isolates", []string{"python3", "-uI", "t.py"}, nil},
		{"-P", []string{"python3", "-P", "t.py"}, nil},
		{"an option it does not know", []string{"python3", "--check-hash-based-pycs", "always", "t.py"}, nil},
		{"stdin", []string{"python3", "-"}, nil},
		{"-m without a module", []string{"python3", "-m"}, nil},
		{"the interpreter alone", []string{"python3"}, nil},
		{"options alone", []string{"python3", "-u"}, nil},
		{"not Python", []string{"/usr/bin/bash", "t.py"}, nil},
		{"a Python-named directory", []string{"/python3/bin/trainer", "t.py"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, warmCommand(tc.argv, warm))
		})
	}
}
