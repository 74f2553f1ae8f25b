// Package cliflag holds the command-line pieces that gorun's commands and
// the gorun-worker binary share: the repeatable --set flag and the flags
// written after a positional train.toml.
package cliflag

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// setValues is the value of the repeatable --set flag: one
// section.key=value per use, kept whole (a TOML array such as
// data.files=["a", "b"] has commas, which a cli.StringSliceFlag would
// split it at).
type setValues []string

// Set appends one use of the flag.
func (s *setValues) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// String is the uses, space-separated.
func (s *setValues) String() string { return strings.Join(*s, " ") }

// Set is a fresh --set flag: section.key=value overrides of a train.toml,
// read back with Sets.
func Set() *cli.GenericFlag {
	return &cli.GenericFlag{Name: "set", Value: &setValues{}, Usage: "override a train.toml value: section.key=value (repeatable; a TOML value, commas and all)"}
}

// Sets is what the --set flags of c gave, in order; nil when c's command
// has no --set flag or it was not given.
func Sets(c *cli.Context) []string {
	if v, ok := c.Generic("set").(*setValues); ok {
		return *v
	}
	return nil
}

// ParseTrailing applies the flags of c's command written after its
// positional arguments (`gorun estimate train.toml --nodes 2`: the flag
// package stops at the first argument that is not a flag, so they arrive
// as arguments) and returns the positional arguments, those after "--"
// included. An unknown flag, or one without its value, is an error that
// names it.
func ParseTrailing(c *cli.Context) ([]string, error) {
	args := c.Args().Slice()
	if len(args) <= 1 {
		return args, nil
	}
	isBool := map[string]bool{}
	names := map[string][]string{} // every name of the flag a name belongs to
	for _, f := range c.Command.Flags {
		_, b := f.(*cli.BoolFlag)
		for _, name := range f.Names() {
			names[name] = f.Names()
			isBool[name] = b
		}
	}
	var positional []string
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
		if names[name] == nil {
			return nil, fmt.Errorf("unknown flag --%s (%s --help lists the flags)", name, c.Command.HelpName)
		}
		switch {
		case hasValue:
		case isBool[name]:
			value = "true"
		case i+1 < len(args):
			i++
			value = args[i]
		default:
			return nil, fmt.Errorf("flag --%s needs a value", name)
		}
		// Set every alias: the flag set holds one value per name.
		for _, alias := range names[name] {
			if err := c.Set(alias, value); err != nil {
				return nil, fmt.Errorf("--%s=%s: %w", name, value, err)
			}
		}
	}
	return positional, nil
}
