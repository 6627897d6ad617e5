package docker

import (
	"bytes"
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
		w := &prefixedLines{out: out, prefix: ansiGrey + "[service:" + name + "] "}
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

// prefixedLines writes each complete line given to it to out in one
// Write, prefixed and ended with a colour reset, so that lines of several
// services and of the job's stages never mix within a line.
type prefixedLines struct {
	out    io.Writer
	prefix string
	buf    []byte
}

func (w *prefixedLines) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if len(w.buf) >= maxServiceLine {
				w.flush()
			}
			return len(p), nil
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func (w *prefixedLines) line(l []byte) {
	b := make([]byte, 0, len(w.prefix)+len(l)+len(ansiReset)+1)
	b = append(b, w.prefix...)
	b = append(b, bytes.TrimSuffix(l, []byte("\r"))...)
	b = append(b, ansiReset...)
	_, _ = w.out.Write(append(b, '\n'))
}

// flush writes what is left of a line.
func (w *prefixedLines) flush() {
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = w.buf[:0]
	}
}
