package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/config"
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

// setFlag is a fresh --set flag.
func setFlag() *cli.GenericFlag {
	return &cli.GenericFlag{Name: "set", Value: &setValues{}, Usage: "override a train.toml value: section.key=value (repeatable; a TOML value, commas and all)"}
}

// setsOf is what the --set flags of c gave, in order.
func setsOf(c *cli.Context) []string {
	if v, ok := c.Generic("set").(*setValues); ok {
		return *v
	}
	return nil
}

// positionalArgs is c's positional arguments after it applies to c the
// flags written among or after them (`gorun estimate train.toml --nodes
// 2`): the flag package stops at the first argument that is not a flag,
// so they arrive as arguments. config.SplitArgs splits them.
func positionalArgs(c *cli.Context) ([]string, error) {
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
	unknown := func(name string) error {
		return fmt.Errorf("unknown flag --%s (%s --help lists the flags)", name, c.Command.HelpName)
	}
	// set sets every alias: the flag set holds one value per name.
	set := func(name, value string) error {
		for _, alias := range names[name] {
			if err := c.Set(alias, value); err != nil {
				return fmt.Errorf("--%s=%s: %w", name, value, err)
			}
		}
		return nil
	}
	first, sets, rest, err := config.SplitArgs(args, func(name string) bool { return names[name] != nil && !isBool[name] })
	if err != nil {
		return nil, err
	}
	if len(sets) > 0 && names["set"] == nil {
		return nil, unknown("set")
	}
	for _, v := range sets {
		if err := set("set", v); err != nil {
			return nil, err
		}
	}
	var positional []string
	if first != "" {
		positional = append(positional, first)
	}
	for i, arg := range rest {
		if arg == "--" {
			positional = append(positional, rest[i+1:]...)
			break
		}
		// SplitArgs gives each flag as one argument, its value after "=".
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		switch {
		case names[name] == nil:
			return nil, unknown(name)
		case hasValue:
		case isBool[name]:
			value = "true"
		default:
			return nil, fmt.Errorf("flag --%s needs a value", name)
		}
		if err := set(name, value); err != nil {
			return nil, err
		}
	}
	return positional, nil
}
