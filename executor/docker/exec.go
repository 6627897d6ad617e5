package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

// apiTimeout bounds single Docker API calls that run on a context of their
// own (creating, removing, signalling), so that a hung daemon cannot hang
// a job forever.
const apiTimeout = 2 * time.Minute

// execSpec is one process to run in a container.
type execSpec struct {
	cmd  []string
	user string
	env  []string
	dir  string
}

// stopFunc stops a running exec when its context is done. It returns when
// the exec should have ended; exited is closed when the exec's output
// ends.
type stopFunc func(ctx context.Context, exited <-chan struct{})

// runExec runs spec in container id, copies its stdout and stderr to out
// (from one goroutine: Write is never called concurrently), and returns
// its exit code. When ctx is done, stop (if any) is called to end the
// process; runExec waits for the output to end (at most drain after stop
// returns) and returns ctx's error. An exec that could not be run at all
// is an error.
func (p *Provider) runExec(ctx context.Context, id string, spec execSpec, out io.Writer, stop stopFunc) (int, error) {
	if out == nil {
		out = io.Discard
	}
	// The exec is created and attached on a context of its own: a done
	// job context must still see the process through to its end.
	own, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	cr, err := p.cli.ContainerExecCreate(own, id, container.ExecOptions{
		User: spec.user, Env: spec.env, WorkingDir: spec.dir, Cmd: spec.cmd,
		AttachStdout: true, AttachStderr: true,
	})
	if err != nil {
		return -1, fmt.Errorf("creating exec: %w", err)
	}
	hj, err := p.cli.ContainerExecAttach(own, cr.ID, container.ExecAttachOptions{})
	if err != nil {
		return -1, fmt.Errorf("starting exec: %w", err)
	}
	defer hj.Close()
	exited := make(chan struct{})
	var copyErr error
	go func() {
		defer close(exited)
		_, copyErr = stdcopy.StdCopy(out, out, hj.Reader)
	}()
	select {
	case <-exited:
	case <-ctx.Done():
		if stop != nil {
			stop(context.WithoutCancel(ctx), exited)
		}
		select {
		case <-exited:
		case <-time.After(drain):
			// Something holds the output open: stop reading rather
			// than hang the job.
			hj.Close()
			<-exited
		}
		return -1, ctx.Err()
	}
	if copyErr != nil && !errors.Is(copyErr, io.EOF) {
		return -1, fmt.Errorf("reading exec output: %w", copyErr)
	}
	return p.execExitCode(own, cr.ID)
}

// drain is how long runExec waits for an exec's output to end after it
// was stopped.
const drain = 10 * time.Second

// execExitCode waits for the daemon to record the end of an exec whose
// output has ended (the output may end a moment before) and returns its
// exit code.
func (p *Provider) execExitCode(ctx context.Context, execID string) (int, error) {
	delay := time.Millisecond
	deadline := time.Now().Add(30 * time.Second)
	for {
		ins, err := p.cli.ContainerExecInspect(ctx, execID)
		if err != nil {
			return -1, fmt.Errorf("inspecting exec: %w", err)
		}
		if !ins.Running {
			return ins.ExitCode, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("exec %s: output ended but the process still runs", execID)
		}
		time.Sleep(delay)
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// writeFile puts one file with content into dir of container id.
func (p *Provider) writeFile(ctx context.Context, id, dir, name string, content []byte, mode int64) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(content)), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(content); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := p.cli.CopyToContainer(ctx, id, dir, &buf, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("copying %s into the container: %w", path.Join(dir, name), err)
	}
	return nil
}

// outputTail collects the last max bytes written to it.
type outputTail struct {
	max int
	buf []byte
	cut bool
}

func (t *outputTail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
		t.cut = true
	}
	return len(p), nil
}
