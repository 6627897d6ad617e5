package pluginproc

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// LogRelay turns a plugin's stderr into records of the host's logger. Lines
// in hclog's JSON format (what go-plugin plugins write: upstream fleeting
// plugins, and those built with Berth's SDKs) keep their level, message and attributes;
// other lines are logged as they are, at a level guessed from a "[LEVEL]"
// prefix, else at info. It also remembers the last lines, to explain a
// plugin that fails to start.
//
// go-plugin writes each line and its newline in separate calls; LogRelay
// buffers until a newline. Use NewLogRelay.
type LogRelay struct {
	logger *slog.Logger
	level  slog.Level // for unstructured lines without a prefix

	mu   sync.Mutex
	buf  []byte
	tail []string
}

// NewLogRelay returns a relay to logger; lines without a level of their
// own are logged at level.
func NewLogRelay(logger *slog.Logger, level slog.Level) *LogRelay {
	return &LogRelay{logger: logger, level: level}
}

const (
	maxLine  = 64 << 10
	tailSize = 10
)

func (r *LogRelay) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	for {
		i := bytes.IndexByte(r.buf, '\n')
		if i < 0 {
			if len(r.buf) > maxLine {
				r.emit(r.buf)
				r.buf = r.buf[:0]
			}
			return len(p), nil
		}
		r.emit(r.buf[:i])
		r.buf = r.buf[i+1:]
	}
}

func (r *LogRelay) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	level, msg, attrs := ParseLogLine(line, r.level)
	r.tail = append(r.tail, msg)
	if len(r.tail) > tailSize {
		r.tail = r.tail[1:]
	}
	r.logger.LogAttrs(context.Background(), level, msg, attrs...)
}

// Tail returns the last lines the plugin logged, oldest first.
func (r *LogRelay) Tail() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tail...)
}

// ParseLogLine decodes one line of plugin output. It never fails: a line
// that is not an hclog JSON object is a message by itself.
func ParseLogLine(line []byte, fallback slog.Level) (slog.Level, string, []slog.Attr) {
	if len(line) > 0 && line[0] == '{' {
		var raw map[string]any
		if json.Unmarshal(line, &raw) == nil {
			if msg, ok := raw["@message"].(string); ok {
				level := fallback
				if l, ok := raw["@level"].(string); ok {
					level = levelOf(l, fallback)
				}
				delete(raw, "@message")
				delete(raw, "@level")
				delete(raw, "@timestamp")
				delete(raw, "@caller")
				attrs := make([]slog.Attr, 0, len(raw))
				for k, v := range raw {
					attrs = append(attrs, slog.Any(strings.TrimPrefix(k, "@"), v))
				}
				slices.SortFunc(attrs, func(a, b slog.Attr) int { return strings.Compare(a.Key, b.Key) })
				return level, msg, attrs
			}
		}
	}
	s := string(line)
	for _, p := range []struct {
		prefix string
		level  slog.Level
	}{
		{"[TRACE]", slog.LevelDebug - 4}, {"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo},
		{"[WARN]", slog.LevelWarn}, {"[ERROR]", slog.LevelError},
		{"panic: ", slog.LevelError}, {"fatal error: ", slog.LevelError},
	} {
		if strings.HasPrefix(s, p.prefix) {
			return p.level, strings.TrimSpace(strings.TrimPrefix(s, p.prefix)), nil
		}
	}
	return fallback, s, nil
}

func levelOf(s string, fallback slog.Level) slog.Level {
	switch strings.ToLower(s) {
	case "trace":
		return slog.LevelDebug - 4
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return fallback
}
