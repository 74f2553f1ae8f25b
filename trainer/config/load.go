package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/gorun/gorun/trainer/data"
)

// Error is one problem with a train.toml, printed on one line as
// "train.toml:12: train.steps = -5: must be at least 1" or
// "--set train.steps=-5: must be at least 1".
type Error struct {
	// Where is "file:line", the file alone (a default value, or a problem
	// with no line), "--set key=value", or "" (Validate).
	Where string
	// Key is "section.key", or "" when the problem is not about one key.
	Key string
	// Value is the value of Key as TOML writes it, or "" when the message
	// says it already.
	Value string
	// Msg says what is wrong.
	Msg string
}

// Error formats e on one line.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Where != "" {
		b.WriteString(e.Where + ": ")
	}
	if e.Key != "" && e.Value != "" && !strings.HasPrefix(e.Where, "--set ") {
		b.WriteString(e.Key + " = " + e.Value + ": ")
	}
	b.WriteString(e.Msg)
	// A key or value may hold a line break (a quoted TOML key, a --set
	// key): escape it, so the error stays on one line.
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(b.String())
}

// Load reads the train.toml at path, applies the --set overrides in order
// (each "section.key=value" with a TOML value; a bare word is taken as a
// string), and validates the result. Relative paths (checkpoint.dir,
// train.metrics, data.files) are made absolute against the file's
// directory, and $VARS in data.files are expanded ($GOROOT defaults to the
// Go root gorun was built with); data.files left empty become
// [data.Builtin], the corpus built into gorun, and that name is kept as
// it is. Every error is an *Error on one line that
// names the file and line, or the --set, and the key.
func Load(path string, sets []string) (Config, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(path, doc, sets)
}

// Parse is Load on the contents doc of a file called name: name is used in
// errors and its directory anchors relative paths.
func Parse(name string, doc []byte, sets []string) (Config, error) {
	c := Default()
	if err := decode(doc, &c); err != nil {
		return Config{}, fileError(name, err)
	}
	origins := map[string]origin{}
	for key, line := range keyLines(doc) {
		origins[key] = origin{where: fmt.Sprintf("%s:%d", name, line), rank: 1}
	}
	for i, set := range sets {
		key, err := applySet(&c, set)
		if err != nil {
			return Config{}, err
		}
		origins[key] = origin{where: "--set " + set, rank: 2 + i}
	}
	if len(c.Data.Files) == 0 {
		c.Data.Files = []string{data.Builtin}
	}
	c.rawFiles = slices.Clone(c.Data.Files)
	where := func(key string) string {
		if o, ok := origins[key]; ok {
			return o.where
		}
		return name
	}
	if p := c.problem(); p != nil {
		b := p[0]
		for _, alt := range p[1:] {
			if origins[alt.key].rank > origins[b.key].rank {
				b = alt
			}
		}
		return Config{}, &Error{Where: where(b.key), Key: b.key, Value: formatValue(c, b.key), Msg: b.msg}
	}
	dir := filepath.Dir(name)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	for i, pattern := range c.Data.Files {
		if data.IsBuiltin(pattern) {
			continue
		}
		expanded, err := expand(pattern)
		if err != nil {
			return Config{}, &Error{Where: where("data.files"), Key: "data.files", Value: formatValue(c, "data.files"), Msg: err.Error()}
		}
		c.Data.Files[i] = anchor(dir, expanded)
	}
	c.Checkpoint.Dir = anchor(dir, c.Checkpoint.Dir)
	if c.Train.Metrics != "" {
		c.Train.Metrics = anchor(dir, c.Train.Metrics)
	}
	return c, nil
}

// origin is where a key's value came from; a higher rank was written later.
type origin struct {
	where string
	rank  int
}

// decode decodes a TOML document strictly onto c.
func decode(doc []byte, c *Config) error {
	return toml.NewDecoder(bytes.NewReader(doc)).DisallowUnknownFields().Decode(c)
}

var typeMismatch = regexp.MustCompile(`^cannot decode TOML (.+?) into `)

// describe turns a go-toml error into (line, message).
func describe(err error) (line int, msg string) {
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return 0, err.Error()
	}
	line, _ = de.Position()
	msg = strings.TrimPrefix(de.Error(), "toml: ")
	key := strings.Join(de.Key(), ".")
	var strict *toml.StrictMissingError
	switch {
	case errors.As(err, &strict) && msg == "missing table":
		msg = fmt.Sprintf("unknown section [%s] (the sections are %s)", key, strings.Join(sections(), ", "))
	case errors.As(err, &strict):
		msg = unknownKey(key)
		if more := len(strict.Errors) - 1; more > 0 {
			msg += fmt.Sprintf("; and %d more unknown", more)
		}
	default:
		if f, ok := lookup(key); ok {
			if m := typeMismatch.FindStringSubmatch(msg); m != nil {
				msg = fmt.Sprintf("%s: want %s, got a TOML %s", key, want(f.typ), m[1])
			} else {
				msg = key + ": " + msg
			}
		}
	}
	return line, msg
}

// fileError places a decoding error of file name.
func fileError(name string, err error) error {
	line, msg := describe(err)
	where := name
	if line > 0 {
		where = fmt.Sprintf("%s:%d", name, line)
	}
	return &Error{Where: where, Msg: msg}
}

// applySet decodes one "section.key=value" onto c and returns the key.
func applySet(c *Config, set string) (string, error) {
	shown := set
	if strings.ContainsAny(set, "\r\n") {
		shown = strconv.Quote(set) // keep the error on one line
	}
	fail := func(msg string) error { return &Error{Where: "--set " + shown, Msg: msg} }
	key, value, ok := strings.Cut(set, "=")
	key = strings.TrimSpace(key)
	section, name, dotted := strings.Cut(key, ".")
	if !ok || !dotted || section == "" || name == "" {
		return "", fail("want section.key=value, e.g. --set train.steps=20")
	}
	f, known := lookup(key)
	if !known {
		return "", fail(unknownKey(key))
	}
	if strings.ContainsAny(value, "\r\n") {
		return "", fail("the value must fit on one line")
	}
	doc := func(v string) []byte { return []byte("[" + section + "]\n" + name + " = " + v + "\n") }
	// Decode into a copy so a failed --set leaves c as it was.
	next := *c
	next.Data.Files = slices.Clone(c.Data.Files)
	err := decode(doc(value), &next)
	var perr *toml.DecodeError
	if err != nil && f.typ.Kind() == reflect.String && errors.As(err, &perr) && len(perr.Key()) == 0 {
		// Not a TOML value: a bare word such as fsdp is the string itself.
		err = decode(doc(strconv.Quote(strings.TrimSpace(value))), &next)
	}
	if err != nil {
		_, msg := describe(err)
		if errors.As(err, &perr) && len(perr.Key()) == 0 {
			msg = fmt.Sprintf("%s: want %s", key, want(f.typ))
		}
		return "", fail(msg)
	}
	*c = next
	return key, nil
}

// keyLines maps every "section.key" of a TOML document to the line it is
// set on. The document has decoded already, so it parses.
func keyLines(doc []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(doc)
	var table []string
	var visit func(prefix []string, n *unstable.Node)
	visit = func(prefix []string, n *unstable.Node) {
		key := slices.Clone(prefix)
		line := 0
		for it := n.Key(); it.Next(); {
			if line == 0 {
				line = p.Shape(it.Node().Raw).Start.Line
			}
			key = append(key, string(it.Node().Data))
		}
		if v := n.Value(); v != nil && v.Kind == unstable.InlineTable {
			for it := v.Children(); it.Next(); {
				visit(key, it.Node())
			}
			return
		}
		if k := strings.Join(key, "."); lines[k] == 0 {
			lines[k] = line
		}
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = table[:0]
			for it := e.Key(); it.Next(); {
				table = append(table, string(it.Node().Data))
			}
		case unstable.KeyValue:
			visit(table, e)
		}
	}
	return lines
}

// expand replaces $VAR and ${VAR} in pattern from the environment; GOROOT
// falls back to the Go root gorun was built with, else to `go env GOROOT`
// (a -trimpath build records none), so that `gorun plan`, gorun and its
// workers agree. A variable that is not set is an error: an empty
// expansion would silently read other files.
func expand(pattern string) (string, error) {
	var missing []string
	out := os.Expand(pattern, func(name string) string {
		if v, ok := os.LookupEnv(name); ok {
			return v
		}
		if name == "GOROOT" {
			//nolint:staticcheck // the build's GOROOT is the best default we have
			if root := defaultGoRoot(runtime.GOROOT(), goEnvGOROOT); root != "" {
				return root
			}
		}
		missing = append(missing, "$"+name)
		return ""
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%s is not set in the environment", strings.Join(missing, ", "))
	}
	return out, nil
}

// goEnvTimeout bounds `go env GOROOT`.
const goEnvTimeout = 10 * time.Second

// defaultGoRoot is the Go root $GOROOT stands for when the environment has
// none: built, the Go root of the build; else what goEnv answers; "" when
// neither knows.
func defaultGoRoot(built string, goEnv func() (string, error)) string {
	if built != "" {
		return built
	}
	root, err := goEnv()
	if err != nil {
		return ""
	}
	return root
}

// goEnvGOROOT asks the go command on PATH for its GOROOT.
func goEnvGOROOT() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), goEnvTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// anchor makes a relative path absolute against dir.
func anchor(dir, path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(dir, path)
}
