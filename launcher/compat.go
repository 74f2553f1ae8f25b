package launcher

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ParseSeconds reads a time as torchrun writes it, seconds as a plain
// number ("5", "0.1"), or as a Go duration ("100ms", "1m30s"). It must
// be finite and not negative.
func ParseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return 0, fmt.Errorf("%q is negative: want 0 or more", s)
		}
		return d, nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
		return 0, fmt.Errorf("%q is not a time: want seconds (5, 0.1) or a duration (100ms, 2m)", s)
	}
	if secs < 0 {
		return 0, fmt.Errorf("%q is negative: want 0 or more", s)
	}
	if secs > float64(math.MaxInt64)/float64(time.Second) {
		return 0, fmt.Errorf("%q seconds is too long", s)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// torchrun's choices for the flags gorun accepts and validates.
var (
	startMethods     = []string{"spawn", "fork", "forkserver"}
	eventLogHandlers = []string{"null", "console", "dynamic_rendezvous"}
)

// handledSignals are the signals a gorun agent acts on: the first four
// stop the job (as torchrun's default --signals-to-handle), SIGUSR1 and
// SIGUSR2 (SLURM's warning) are passed on to the workers, which go on.
var handledSignals = []unix.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

// ParseSignals parses --signals-to-handle: comma-separated names, as
// torchrun takes them ("SIGTERM,SIGUSR1"; gorun also takes "TERM").
func ParseSignals(s string) ([]unix.Signal, error) {
	var sigs []unix.Signal
	for _, name := range strings.Split(s, ",") {
		name = strings.ToUpper(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		if !strings.HasPrefix(name, "SIG") {
			name = "SIG" + name
		}
		sig := unix.SignalNum(name)
		if sig == 0 {
			return nil, fmt.Errorf("%q is not a signal name (e.g. SIGTERM,SIGUSR1)", name)
		}
		sigs = append(sigs, sig)
	}
	return sigs, nil
}

// ParseFilters splits torchrun's --duplicate-std{out,err}-filters: a
// comma-separated list in which ",," stands for a comma.
func ParseFilters(s string) []string {
	if s == "" {
		return nil
	}
	const placeholder = "\x00"
	parts := strings.Split(strings.ReplaceAll(s, ",,", placeholder), ",")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(p, placeholder, ",")
	}
	return parts
}

// checkCompat validates torchrun's flags that change nothing in gorun,
// or that gorun cannot honour, and notes each one that a user would miss:
// the notes are printed by `gorun plan` and logged at launch.
func (l *Launch) checkCompat(opts Options) error {
	if opts.MonitorInterval < 0 {
		return usagef("--monitor-interval=%s: want 0 or more seconds", opts.MonitorInterval)
	}
	if m := opts.StartMethod; m != "" && !slices.Contains(startMethods, m) {
		return usagef("--start-method=%s: want %s (it changes nothing in gorun: every worker is a new process)", m, strings.Join(startMethods, ", "))
	}
	switch h := opts.EventLogHandler; {
	case h == "" || h == "null" || h == "dynamic_rendezvous":
	case h == "console":
		l.note("--event-log-handler=console: gorun logs its own events on stderr (--log-level, --log-format), not torchrun's event records")
	default:
		return usagef("--event-log-handler=%s: want %s (torchrun's registered handlers; gorun logs its own events on stderr)", h, strings.Join(eventLogHandlers, ", "))
	}
	if opts.LogsSpecs != "" {
		l.note(fmt.Sprintf("--logs-specs=%s ignored: gorun loads no torchrun.logs_specs plugins; worker logs go where --log-dir, --redirects and --tee say", opts.LogsSpecs))
	}
	if opts.SignalsToHandle != "" {
		sigs, err := ParseSignals(opts.SignalsToHandle)
		if err != nil {
			return usagef("--signals-to-handle=%s: %v", opts.SignalsToHandle, err)
		}
		for _, sig := range sigs {
			if !slices.Contains(handledSignals, sig) {
				l.note(fmt.Sprintf("--signals-to-handle: gorun does not handle %s (its default action applies); it stops the job on SIGTERM, SIGINT, SIGHUP, SIGQUIT and passes SIGUSR1, SIGUSR2 on to the workers", unix.SignalName(sig)))
			}
		}
	}
	for _, f := range []struct{ name, value string }{
		{"--duplicate-stdout-filters", opts.DupStdoutFilters}, {"--duplicate-stderr-filters", opts.DupStderrFilters},
	} {
		if len(ParseFilters(f.value)) > 0 {
			l.note(fmt.Sprintf("%s=%s ignored: gorun does not yet copy matching lines to a side file (--log-dir keeps every line)", f.name, f.value))
		}
	}
	return nil
}

// note records something gorun does differently from torchrun for this
// command line.
func (l *Launch) note(msg string) { l.Notes = append(l.Notes, msg) }
