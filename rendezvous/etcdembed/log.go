package etcdembed

import (
	"slices"
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
