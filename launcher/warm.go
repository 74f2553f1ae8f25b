package launcher

import (
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// WarmDelay is elastic.Spec.WarmDelay: the next warm workers start at a
// round's first snapshot on the node, so that their imports of torch do
// not slow the round's start, or this long after its workers started, for
// a script that saves none.
const WarmDelay = 30 * time.Second

// pythonName matches the interpreters warmCommand knows: python, python3,
// python3.11.
var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// warmCommand is the command of a warm worker (elastic.Spec.Warm) for the
// worker command argv, with warm the path of python/gorun/_warm.py: the
// same interpreter and options, then warm, then the script or `-m module`
// and their arguments. It is nil when argv is not a Python interpreter
// running a script or a module, or gives an option a warm worker cannot
// keep: -c (--run-path), -E, -I and -P (PYTHONPATH and sys.path, which
// _warm.py needs as a script would have them), and any it does not know.
func warmCommand(argv []string, warm string) []string {
	if len(argv) < 2 || !pythonName.MatchString(filepath.Base(argv[0])) {
		return nil
	}
	for i := 1; i < len(argv); i++ {
		arg := argv[i]
		switch {
		case arg == "-m":
			if i+1 == len(argv) {
				return nil
			}
		case arg == "-W" || arg == "-X":
			i++ // its value
			continue
		case strings.HasPrefix(arg, "-W") || strings.HasPrefix(arg, "-X"):
			continue
		case strings.HasPrefix(arg, "-") && len(arg) > 1 && strings.Trim(arg[1:], "uBObdqsvR") == "":
			continue
		case strings.HasPrefix(arg, "-"):
			return nil
		}
		return append(append(append([]string{}, argv[:i]...), warm), argv[i:]...)
	}
	return nil
}
