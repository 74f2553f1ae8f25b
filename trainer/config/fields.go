package config

import (
	"fmt"
	"reflect"
	"strings"
)

// field is one train.toml key: "section.key" and where it lives in Config.
type field struct {
	key   string
	index []int
	typ   reflect.Type
}

// fields lists every key of train.toml in the order of the Config struct.
func fields() []field {
	var out []field
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		sf := ct.Field(i)
		section := sf.Tag.Get("toml")
		if section == "" || section == "-" {
			continue
		}
		st := sf.Type
		for j := range st.NumField() {
			kf := st.Field(j)
			out = append(out, field{key: section + "." + kf.Tag.Get("toml"), index: []int{i, j}, typ: kf.Type})
		}
	}
	return out
}

// lookup returns the field of key, if train.toml has it.
func lookup(key string) (field, bool) {
	for _, f := range fields() {
		if f.key == key {
			return f, true
		}
	}
	return field{}, false
}

// sections lists the section names, in order.
func sections() []string {
	var out []string
	for _, f := range fields() {
		s, _, _ := strings.Cut(f.key, ".")
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

// sectionKeys lists the keys of one section, without the section name.
func sectionKeys(section string) []string {
	var out []string
	for _, f := range fields() {
		if s, k, _ := strings.Cut(f.key, "."); s == section {
			out = append(out, k)
		}
	}
	return out
}

// unknownKey explains that key is not in train.toml and says what is.
func unknownKey(key string) string {
	section, _, dotted := strings.Cut(key, ".")
	if !dotted {
		return fmt.Sprintf("unknown key %s outside any section (the sections are %s)", key, strings.Join(sections(), ", "))
	}
	if keys := sectionKeys(section); len(keys) > 0 {
		return fmt.Sprintf("unknown key %s ([%s] has %s)", key, section, strings.Join(keys, ", "))
	}
	return fmt.Sprintf("unknown key %s (the sections are %s)", key, strings.Join(sections(), ", "))
}

// want describes the TOML type a Go field takes.
func want(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int:
		return "an integer"
	case reflect.Uint64:
		return "an integer at least 0"
	case reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice:
		return "an array of " + strings.TrimPrefix(want(t.Elem()), "a ") + "s"
	}
	return t.String()
}

// formatValue writes the value of key in c as TOML would.
func formatValue(c Config, key string) string {
	f, ok := lookup(key)
	if !ok {
		return ""
	}
	return tomlValue(reflect.ValueOf(c).FieldByIndex(f.index))
}

func tomlValue(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return fmt.Sprintf("%q", v.String())
	case reflect.Float64:
		return fmt.Sprintf("%g", v.Float())
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = tomlValue(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}
