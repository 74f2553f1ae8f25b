package main

import (
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
