package custom

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
)

// Exit codes of the protocol, passed to every driver call as
// BUILD_FAILURE_EXIT_CODE and SYSTEM_FAILURE_EXIT_CODE.
const (
	// BuildFailureExitCode: the job's script failed (script_failure). The
	// script's own exit code may be written to BUILD_EXIT_CODE_FILE.
	BuildFailureExitCode = 1
	// SystemFailureExitCode: the environment failed (runner_system_failure).
	SystemFailureExitCode = 2
)

// ErrSystemFailure is matched (errors.Is) by the error of a driver program
// that exited with SYSTEM_FAILURE_EXIT_CODE.
var ErrSystemFailure = errors.New("system failure reported by the driver")

// DriverError is a driver program that exited with neither 0 nor
// BUILD_FAILURE_EXIT_CODE (or cleanup_exec with any non-zero code), or was
// killed by a signal nobody sent it. It is a system failure: the runner
// reports runner_system_failure.
type DriverError struct {
	// Program is config_exec, prepare_exec, run_exec or cleanup_exec;
	// Path is its executable.
	Program, Path string
	// Code is the exit code, -1 when Signal killed it.
	Code   int
	Signal syscall.Signal
}

func (e *DriverError) Error() string {
	switch {
	case e.Code < 0:
		return fmt.Sprintf("%s %s: killed by signal %d (%s)", e.Program, e.Path, int(e.Signal), e.Signal)
	case e.Code == SystemFailureExitCode:
		return fmt.Sprintf("%s %s: exit code %d: %s", e.Program, e.Path, e.Code, ErrSystemFailure)
	case e.Code == BuildFailureExitCode:
		return fmt.Sprintf("%s %s: exit code %d", e.Program, e.Path, e.Code)
	}
	return fmt.Sprintf("%s %s: unknown Custom executor executable exit code %d", e.Program, e.Path, e.Code)
}

// Is makes errors.Is(err, ErrSystemFailure) true for exit code
// SYSTEM_FAILURE_EXIT_CODE.
func (e *DriverError) Is(target error) bool {
	return target == ErrSystemFailure && e.Code == SystemFailureExitCode
}

// drainTimeout bounds how long the output of a driver program that has
// exited is still read: a process it left running (a daemon started by
// prepare_exec that kept its stdout) must not hang the job.
const drainTimeout = 5 * time.Second

// call is one invocation of a driver program.
type call struct {
	program string // config_exec, prepare_exec, run_exec, cleanup_exec
	path    string
	args    []string
	dir     string
	env     []string
	// stdout receives stdout, and stderr too when stderr is nil (one
	// pipe, one reader: Write is never called concurrently).
	stdout, stderr io.Writer
	// stageMarker, for run_exec, is the marker in env: the stage's
	// processes that left the driver's process group are found by it and
	// killed with the group, and when the call ends. Other calls
	// leave their processes running (a driver may start what the job's
	// environment needs); Cleanup kills them by the job's marker after
	// cleanup_exec.
	stageMarker string
	// graceful is the wait between SIGTERM and SIGKILL, force the wait
	// after SIGKILL before the program is abandoned.
	graceful, force time.Duration
}

// status is how a driver program ended.
type status struct {
	code int            // exit code, -1 when killed by a signal
	sig  syscall.Signal // the signal, when code is -1
}

// group is a running driver program: its process group (the driver runs
// in its own) and, for a stage, the marker of its processes.
type group struct {
	pgid   int
	marker string
}

// signal sends sig to the group. SIGKILL also goes to the stage's
// marked processes; SIGTERM does not: as with gitlab-runner, a driver
// gets exactly one SIGTERM (a second one, through the marker, would hit a
// driver whose handler has reset the signal's default action). The error
// is the group's: ESRCH when the group is gone.
func (g group) signal(sig syscall.Signal) error {
	err := syscall.Kill(-g.pgid, sig)
	if g.marker != "" && sig == syscall.SIGKILL {
		_, _ = reap.Signal(g.marker, sig)
	}
	return err
}

// signaler is what stop signals.
type signaler interface {
	signal(sig syscall.Signal) error
}

// stop ends a driver program whose context is done, as GitLab does:
// SIGTERM, wait up to graceful for exited to close, SIGKILL (at once when
// SIGTERM could not be sent), wait up to force; it reports true when the
// program is still running then and is abandoned.
func stop(p signaler, exited <-chan struct{}, graceful, force time.Duration) (abandoned bool) {
	if err := p.signal(syscall.SIGTERM); err == nil {
		t := time.NewTimer(graceful)
		select {
		case <-exited:
			t.Stop()
			return false
		case <-t.C:
		}
	}
	_ = p.signal(syscall.SIGKILL)
	t := time.NewTimer(force)
	defer t.Stop()
	select {
	case <-exited:
		return false
	case <-t.C:
		return true
	}
}

// invoke runs one driver program to its end. It returns the program's
// exit status, or an error when the program could not be started, or
// when ctx was done (the error wraps ctx's error and cause; the program
// was stopped as stop does). The output is read until the program has
// exited and its output is drained; invoke never returns while a Write
// to c.stdout or c.stderr may still happen.
func (e *Executor) invoke(ctx context.Context, c call) (status, error) {
	what := c.program + " " + c.path
	if err := ctx.Err(); err != nil {
		return status{}, stopped(what, ctx)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return status{}, fmt.Errorf("%s: %w", what, err)
	}
	errR, errW := outR, outW
	if c.stderr != nil {
		if errR, errW, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			return status{}, fmt.Errorf("%s: %w", what, err)
		}
	}
	cmd := exec.Command(c.path, c.args...)
	cmd.Dir, cmd.Env = c.dir, c.env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	startErr := cmd.Start()
	outW.Close()
	if errW != outW {
		errW.Close()
	}
	if startErr != nil {
		outR.Close()
		if errR != outR {
			errR.Close()
		}
		return status{}, fmt.Errorf("starting %s: %w", what, startErr)
	}
	g := group{pgid: cmd.Process.Pid, marker: c.stageMarker}
	e.track(g, true)
	defer e.track(g, false)

	copied := []<-chan struct{}{copyOut(outR, c.stdout)}
	if errR != outR {
		copied = append(copied, copyOut(errR, c.stderr))
	}
	exited := make(chan struct{})
	var werr error
	go func() {
		werr = cmd.Wait()
		close(exited)
	}()
	abandoned := false
	select {
	case <-exited:
	case <-ctx.Done():
		abandoned = stop(g, exited, c.graceful, c.force)
	}
	if c.stageMarker != "" {
		// Whatever the stage left behind, in the driver's group or
		// escaped from it, ends with it.
		_ = g.signal(syscall.SIGKILL)
	}
	drain := drainTimeout
	if abandoned {
		drain = 0
	}
	deadline := time.NewTimer(drain)
	for _, done := range copied {
		select {
		case <-done:
		case <-deadline.C:
		}
	}
	deadline.Stop()
	outR.Close()
	if errR != outR {
		errR.Close()
	}
	for _, done := range copied {
		<-done
	}
	if abandoned {
		e.log.Warn("driver program did not exit after SIGKILL; abandoned", "program", c.program, "path", c.path, "pid", g.pgid)
		return status{}, stopped(fmt.Sprintf("%s: did not exit %s after SIGKILL, abandoned", what, c.force), ctx)
	}
	if ctx.Err() != nil {
		return status{}, stopped(what, ctx)
	}
	if werr == nil {
		return status{}, nil
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) {
		return status{}, fmt.Errorf("waiting for %s: %w", what, werr)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return status{code: -1, sig: ws.Signal()}, nil
	}
	return status{code: ee.ExitCode()}, nil
}

// stopped is the error of a call whose context is done: it wraps ctx's
// error and its cause.
func stopped(what string, ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%s: stopped: %w: %w", what, err, cause)
	}
	return fmt.Errorf("%s: stopped: %w", what, err)
}

// withExecTimeout bounds a config, prepare or cleanup call by its
// *_exec_timeout; the cause names the key.
func withExecTimeout(ctx context.Context, key string, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("%s (%s) exceeded", key, d))
}

// copyOut copies r to w until r ends or is closed; the channel is closed
// then.
func copyOut(r io.Reader, w io.Writer) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return done
}

// outcome gives a driver program's exit status its protocol meaning: nil
// for 0; for BUILD_FAILURE_EXIT_CODE an *executor.ExitError of stage with
// the code in BUILD_EXIT_CODE_FILE (1 without the file), or an error when
// the file holds no integer; a *DriverError otherwise.
func outcome(c call, st status, stage, exitCodeFile string) error {
	switch {
	case st.code == 0:
		return nil
	case st.code == BuildFailureExitCode:
		return buildFailure(stage, exitCodeFile)
	}
	return &DriverError{Program: c.program, Path: c.path, Code: st.code, Signal: st.sig}
}

// buildFailure reads BUILD_EXIT_CODE_FILE: its first line is the script's
// exit code.
func buildFailure(stage, file string) error {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return &executor.ExitError{Stage: stage, Code: BuildFailureExitCode}
	}
	if err != nil {
		return fmt.Errorf("reading BUILD_EXIT_CODE_FILE: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	code, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("BUILD_EXIT_CODE_FILE %s: first line %q is not an exit code", file, abbreviate([]byte(line)))
	}
	return &executor.ExitError{Stage: stage, Code: code}
}

// limitedBuffer keeps the first max bytes written to it and counts the
// rest.
type limitedBuffer struct {
	buf  bytes.Buffer
	max  int
	over int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	keep := min(len(p), b.max-b.buf.Len())
	b.buf.Write(p[:keep])
	b.over += len(p) - keep
	return len(p), nil
}

// logWriter logs every line written to it as one record.
type logWriter struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	buf   []byte
}

// maxLogLine bounds a line kept before it is logged without its end.
const maxLogLine = 64 << 10

func (w *logWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLogLine {
		w.emit(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

// flush logs what is left without a newline.
func (w *logWriter) flush() {
	if len(w.buf) > 0 {
		w.emit(w.buf)
		w.buf = nil
	}
}

func (w *logWriter) emit(line []byte) {
	w.log.Log(context.Background(), w.level, w.msg, "line", string(bytes.TrimSuffix(line, []byte("\r"))))
}
