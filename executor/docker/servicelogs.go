package docker

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

// ansiGrey is the colour of service log lines (gitlab-runner's).
const ansiGrey = "\x1b[0;90m"

// maxServiceLine bounds a service's line held while waiting for its end:
// a service writing without newlines is cut into lines of this size.
const maxServiceLine = 64 << 10

// streamServiceLogs copies every service's output — stdout and stderr,
// with the engine's timestamps — into out until Cleanup, each line
// prefixed "[service:ALIAS] ", as gitlab-runner does for a job with
// CI_DEBUG_SERVICES. A stream that cannot be opened is a warning.
func (e *Executor) streamServiceLogs(j *job, out io.Writer) {
	ctx, cancel := context.WithCancel(context.Background())
	j.stopLogs = cancel
	for _, s := range j.services {
		rc, err := e.p.cli.ContainerLogs(ctx, s.id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: true, Timestamps: true})
		if err != nil {
			fmt.Fprintf(out, "%sWARNING: streaming the logs of service %s: %v%s\n", ansiYellow, s.spec.image, err, ansiReset)
			continue
		}
		// The job's own alias where it gave one (it comes first), else
		// the name derived from the image (gitlab-runner joins them
		// all, in no fixed order).
		name := s.name
		if len(s.spec.aliases) > 0 {
			name = s.spec.aliases[0]
		}
		// Each line in one Write, so that lines of several services and
		// of the job's stages never mix within a line.
		prefix := ansiGrey + "[service:" + name + "] "
		w := &lineWriter{max: maxServiceLine, fn: func(line string) {
			_, _ = io.WriteString(out, prefix+line+ansiReset+"\n")
		}}
		j.logs.Add(1)
		go func() {
			defer j.logs.Done()
			defer rc.Close()
			_, err := stdcopy.StdCopy(w, w, rc)
			w.flush()
			if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				fmt.Fprintf(out, "%sWARNING: streaming the logs of service %s: %v%s\n", ansiYellow, s.spec.image, err, ansiReset)
			}
		}()
	}
}

// stopServiceLogs ends the service log streams and waits for them.
func (j *job) stopServiceLogs() {
	if j.stopLogs != nil {
		j.stopLogs()
		j.logs.Wait()
	}
}
