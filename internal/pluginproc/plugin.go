package pluginproc

import (
	"io"
	"log/slog"
	"os"
	"time"
)

// hclogTimeFormat is the timestamp layout hclog writes and go-plugin hosts
// parse.
const hclogTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// NewLogHandler returns a slog handler writing hclog-compatible JSON lines
// ("@level", "@message", "@timestamp", then the attributes) to w, the format
// go-plugin hosts (GitLab Runner and Berth) parse from a plugin's stderr and
// relay at the right level.
func NewLogHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				if t, ok := a.Value.Any().(time.Time); ok {
					return slog.String("@timestamp", t.Format(hclogTimeFormat))
				}
			case slog.LevelKey:
				lvl, _ := a.Value.Any().(slog.Level)
				return slog.String("@level", hclogLevel(lvl))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	})
}

func hclogLevel(l slog.Level) string {
	switch {
	case l < slog.LevelDebug:
		return "trace"
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	default:
		return "error"
	}
}

// WatchParent calls gone once the parent process (the host) has exited,
// which Unix reveals by reparenting this process, checking every interval.
// A plugin started by pid 1 itself has nothing to watch: WatchParent then
// returns at once.
func WatchParent(interval time.Duration, gone func()) {
	parent := os.Getppid()
	if parent <= 1 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if os.Getppid() != parent {
			gone()
			return
		}
	}
}
