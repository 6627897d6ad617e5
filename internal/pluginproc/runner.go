package pluginproc

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

// Runner runs a plugin process for go-plugin (ClientConfig.RunnerFunc).
// Unlike go-plugin's own runner it
//   - reports the process's exit as soon as it happens (exited), even when a
//     child of the plugin still holds its stdout or stderr open;
//   - asks the kernel to kill the plugin when the host dies (see
//     StartProcess), so a crashed host leaves no plugin behind.
//
// Exited is closed as soon as the process has exited; ExitErr then holds
// what Wait returned and SelfExit whether the process ended by itself
// rather than by Kill.
type Runner struct {
	cmd          *exec.Cmd
	name         string
	deathSignal  bool
	stdoutR      *os.File
	stderrR      *os.File
	exited       chan struct{}
	exitErr      error
	closeReaders sync.Once
	mu           sync.Mutex  // Start against Kill and Pid from other goroutines
	killed       atomic.Bool // Kill was called
	selfExit     bool        // the process exited before Kill was called
}

var _ runner.Runner = (*Runner)(nil)

// NewRunner prepares cmd to run as the plugin process name: its stdout and
// stderr become pipes go-plugin reads, its stdin is empty. With
// deathSignal the kernel kills the plugin when the host dies.
func NewRunner(cmd *exec.Cmd, name string, deathSignal bool) (*Runner, error) {
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
	return &Runner{cmd: cmd, name: name, deathSignal: deathSignal, stdoutR: outR, stderrR: errR, exited: make(chan struct{})}, nil
}

// ErrKilled is Start's answer after Kill: the process is not started.
var ErrKilled = errors.New("plugin process killed before it started")

func (r *Runner) Start(_ context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.killed.Load() {
		err = ErrKilled
	} else {
		err = StartProcess(r.cmd, r.deathSignal)
	}
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

func (r *Runner) closePipes() {
	r.closeReaders.Do(func() {
		r.stdoutR.Close()
		r.stderrR.Close()
	})
}

func (r *Runner) Wait(ctx context.Context) error {
	select {
	case <-r.exited:
		return r.exitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Runner) Kill(_ context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killed.Store(true)
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *Runner) Diagnose(context.Context) string {
	return fmt.Sprintf("is %s a plugin built for this platform, and executable?", r.cmd.Path)
}

// Exited is closed once the process has exited.
func (r *Runner) Exited() <-chan struct{} { return r.exited }

// ExitErr is what waiting for the process returned; valid after Exited.
func (r *Runner) ExitErr() error { return r.exitErr }

// SelfExit reports whether the process ended by itself (an exit status, or
// a signal other than Kill's); valid after Exited.
func (r *Runner) SelfExit() bool { return r.selfExit }

// Pid is the process id, 0 before Start.
func (r *Runner) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Runner) Stdout() io.ReadCloser { return r.stdoutR }
func (r *Runner) Stderr() io.ReadCloser { return r.stderrR }
func (r *Runner) Name() string          { return r.name }

func (r *Runner) ID() string {
	if pid := r.Pid(); pid != 0 {
		return strconv.Itoa(pid)
	}
	return ""
}

func (r *Runner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *Runner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

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
