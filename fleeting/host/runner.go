package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin/runner"
)

// procRunner runs the plugin process for go-plugin. Unlike go-plugin's own
// runner it
//   - reports the process's exit as soon as it happens (exited), even when a
//     child of the plugin still holds its stdout or stderr open;
//   - asks the kernel to kill the plugin when the host dies (see
//     startProcess), so a crashed host leaves no plugin behind.
type procRunner struct {
	cmd          *exec.Cmd
	name         string
	deathSignal  bool
	stdoutR      *os.File
	stderrR      *os.File
	exited       chan struct{}
	exitErr      error
	closeReaders sync.Once
	killed       atomic.Bool // Kill was called
	selfExit     bool        // the process exited before Kill was called
}

var _ runner.Runner = (*procRunner)(nil)

func newProcRunner(cmd *exec.Cmd, name string, deathSignal bool) (*procRunner, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout = outW
	cmd.Stderr = errW
	// The plugin has no use for the host's stdin (a terminal, or the
	// input of `berth fleeting exec`).
	cmd.Stdin = nil
	return &procRunner{cmd: cmd, name: name, deathSignal: deathSignal, stdoutR: outR, stderrR: errR, exited: make(chan struct{})}, nil
}

func (r *procRunner) Start(_ context.Context) error {
	err := startProcess(r.cmd, r.deathSignal)
	// The child has its copies of the write ends; the host keeps none, so
	// the readers see EOF once the plugin (and any child of it) is done.
	r.cmd.Stdout.(*os.File).Close()
	r.cmd.Stderr.(*os.File).Close()
	if err != nil {
		r.stdoutR.Close()
		r.stderrR.Close()
		return err
	}
	go func() {
		r.exitErr = r.cmd.Wait()
		r.selfExit = exitedByItself(r.cmd.ProcessState, r.killed.Load())
		close(r.exited)
		// A grandchild that inherited stdout/stderr would keep go-plugin's
		// readers (and its exit bookkeeping) waiting forever; give the
		// pipes a moment to drain, then close them.
		time.Sleep(time.Second)
		r.closePipes()
	}()
	return nil
}

func (r *procRunner) closePipes() {
	r.closeReaders.Do(func() {
		r.stdoutR.Close()
		r.stderrR.Close()
	})
}

func (r *procRunner) Wait(ctx context.Context) error {
	select {
	case <-r.exited:
		return r.exitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *procRunner) Kill(_ context.Context) error {
	r.killed.Store(true)
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *procRunner) Diagnose(context.Context) string {
	return fmt.Sprintf("is %s a fleeting plugin built for this platform, and executable?", r.cmd.Path)
}

func (r *procRunner) Stdout() io.ReadCloser { return r.stdoutR }
func (r *procRunner) Stderr() io.ReadCloser { return r.stderrR }
func (r *procRunner) Name() string          { return r.name }

func (r *procRunner) ID() string {
	if r.cmd.Process == nil {
		return ""
	}
	return strconv.Itoa(r.cmd.Process.Pid)
}

func (r *procRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *procRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// exitedByItself tells a process that ended on its own (an exit status, or a
// signal that is not our SIGKILL) from one we killed.
func exitedByItself(ps *os.ProcessState, killed bool) bool {
	if ps == nil {
		return false
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return !killed
	}
	if ws.Exited() {
		return true
	}
	return !killed || ws.Signal() != syscall.SIGKILL
}
