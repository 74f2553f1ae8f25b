package etcdembed

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	"go.uber.org/zap/zapcore"
)

// zerologCore is a zap core that passes etcd's warnings and errors to a
// zerolog logger and drops the rest. Warnings that every start or stop
// of a healthy member gives, and everything logged once closing is set,
// go out at debug level: a clean shutdown is not an error.
type zerologCore struct {
	log     zerolog.Logger
	fields  []zapcore.Field
	closing *atomic.Bool // nil: never closing
}

// routineWarning says whether etcd logs msg at warn or error level on
// every start of an embedded member, through no fault of anyone's.
func routineWarning(msg string) bool {
	switch msg {
	case "Running http and grpc server on single port. This is not recommended for production.",
		"simple token is not cryptographically signed",
		"Failed to detect schema version",
		"failed to update storage version":
		return true
	}
	return false
}

func (c zerologCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c zerologCore) With(fields []zapcore.Field) zapcore.Core {
	return zerologCore{log: c.log, fields: append(slices.Clip(c.fields), fields...), closing: c.closing}
}

func (c zerologCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c zerologCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := zerolog.ErrorLevel
	switch {
	case e.Level >= zapcore.DPanicLevel:
		level = zerolog.DebugLevel // fatalTrap makes it the error Start returns or Err delivers
	case routineWarning(e.Message) || (c.closing != nil && c.closing.Load()):
		level = zerolog.DebugLevel
	case e.Level == zapcore.WarnLevel:
		level = zerolog.WarnLevel
	}
	ev := c.log.WithLevel(level)
	if ev == nil {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	ev.Fields(enc.Fields).Msg(e.Message)
	return nil
}

func (c zerologCore) Sync() error { return nil }

// fatalTrap is the hook of etcd's logger at its Panic and Fatal levels
// (zap.WithPanicHook, zap.WithFatalHook): rather than panic (a stack
// trace on the user's screen) or exit the process, it keeps the first
// such entry as an error, which Start returns or Err delivers, and ends
// only the goroutine that logged it (runtime.Goexit: its deferred calls
// run). A member in that state is broken; it is to be closed.
type fatalTrap struct {
	once sync.Once
	c    chan error // buffered: the first entry's error
}

func newFatalTrap() *fatalTrap { return &fatalTrap{c: make(chan error, 1)} }

// OnWrite keeps the entry and ends the calling goroutine.
func (t *fatalTrap) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	t.once.Do(func() { t.c <- entryError(ce.Entry, fields) })
	runtime.Goexit()
}

// entryError turns a log entry into an error: its message, then its
// fields as key=value in key order, e.g. "failed to create WAL (error=...,
// path=...)".
func entryError(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	if len(enc.Fields) == 0 {
		return errors.New(e.Message)
	}
	parts := make([]string, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, enc.Fields[k]))
	}
	return fmt.Errorf("%s (%s)", e.Message, strings.Join(parts, ", "))
}
