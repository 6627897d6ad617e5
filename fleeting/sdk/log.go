package sdk

import (
	"io"
	"log/slog"

	"github.com/berthci/berth/internal/pluginproc"
)

// NewLogHandler returns a slog handler writing hclog-compatible JSON lines
// ("@level", "@message", "@timestamp", then the attributes) to w, the format
// go-plugin hosts (GitLab Runner and Berth) parse from a plugin's stderr and
// relay at the right level.
func NewLogHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return pluginproc.NewLogHandler(w, level)
}
