// Package readycommand readies new instances for taskscaler the way GitLab
// Runner does: it connects through the fleeting connector and runs
// instance_ready_command. It is the only part of the autoscaler that
// touches SSH, kept apart so the scaler, its tests and the simulator do not.
package readycommand

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
)

// Readier is a taskscaler.Readier.
type Readier struct {
	// Command is instance_ready_command; empty: connecting is enough.
	Command string
	// Options are the connector's (use_external_addr, host keys, logger).
	Options connector.Options
	// Logger receives the command's output on failure. Default: discard.
	Logger *slog.Logger
}

// Ready dials the instance and runs Command, bounded by ctx (the scaler
// bounds it with instance_ready_timeout). A non-zero exit is an error that
// carries the end of the command's output.
func (r *Readier) Ready(ctx context.Context, info fleeting.ConnectInfo) error {
	c, err := connector.Dial(ctx, info, r.Options)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	defer c.Close()
	if r.Command == "" {
		return nil
	}
	var out tail
	if err := c.Run(ctx, connector.Command{Cmd: r.Command, Stdout: &out, Stderr: &out}); err != nil {
		return fmt.Errorf("ready-up of instance %s: instance_ready_command: %w: %s", info.ID, err, bytes.TrimSpace(out.b))
	}
	return nil
}

// tail keeps the last 1 KiB written.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 1024 {
		t.b = t.b[len(t.b)-1024:]
	}
	return len(p), nil
}
