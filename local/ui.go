package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/berthci/berth/coordinator/embedded"
)

// serveUI serves the embedded coordinator's web UI on a loopback address
// of its own (jobs may reach the coordinator on Docker's bridge; the UI
// is for this machine's user only) and hands opts.Ready a one-time link
// that signs the browser in as the run's admin and leads to the
// pipeline. The admin token itself is never shown.
func serveUI(ctx context.Context, srv *embedded.Coordinator, adminTok string, pipelineID int64, opts *UIOptions) (func(), error) {
	addr := opts.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--ui-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("--ui-listen %q: the UI of a local run listens on loopback only", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving the UI: %w", err)
	}
	hs := &http.Server{Handler: srv.UI(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener went: nothing to tell the run
		}
	}()
	link, err := srv.UI().SignInURL(ctx, adminTok, fmt.Sprintf("/-/pipelines/%d", pipelineID), 15*time.Minute)
	if err != nil {
		hs.Close()
		return nil, fmt.Errorf("signing in to the UI: %w", err)
	}
	if opts.Ready != nil {
		opts.Ready("http://" + ln.Addr().String() + link)
	}
	return func() { hs.Close() }, nil
}
