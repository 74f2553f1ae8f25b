package config

import (
	"fmt"
	"strings"
)

// SplitArgs splits the command line of a command that reads one file (a
// train.toml) and flags written before or after it, in the standard flag
// package's forms: -name or --name, with its value after "=" or as the
// next argument, and "--" ending the flags. valued says which flags other
// than --set take a value (a nil valued: none do unless written with
// "="); --set always takes one.
//
// It returns the file (the first argument that is neither a flag nor a
// flag's value, "" if there is none), the value of every --set in order,
// and the rest for the command's own flag parser: every other flag as one
// argument, as written with "=value" added when its value came as the
// next argument, in order, then, when there are more positional
// arguments, "--" and those. The only error is a --set written last,
// without its value; another flag written so is handed on as written, for
// its parser to report.
func SplitArgs(args []string, valued func(name string) bool) (toml string, sets, rest []string, err error) {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			positional = append(positional, arg)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		takesValue := name == "set" || (valued != nil && valued(name))
		if takesValue && !hasValue {
			if i+1 == len(args) {
				if name == "set" {
					return "", nil, nil, fmt.Errorf("flag --%s needs a value", name)
				}
				flags = append(flags, arg) // the command's parser says what it lacks
				continue
			}
			i++
			value = args[i]
			arg += "=" + value
		}
		if name == "set" {
			sets = append(sets, value)
		} else {
			flags = append(flags, arg)
		}
	}
	if len(positional) > 0 {
		toml = positional[0]
		if len(positional) > 1 {
			flags = append(append(flags, "--"), positional[1:]...)
		}
	}
	return toml, sets, flags, nil
}
