package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/berthci/berth/guest"
)

// proc is a running QEMU.
type proc struct {
	cmd    *exec.Cmd
	pid    int
	exited chan struct{} // closed once QEMU exited and was reaped
	err    error         // how it exited; set before exited closes
	// mux serves the agent to the VM's clients (set by boot once the
	// port is connected).
	mux *guest.HostMux
}

// closeMux stops serving the agent.
func (p *proc) closeMux() {
	if p.mux != nil {
		p.mux.Close()
	}
}

// killWait bounds the wait for a QEMU after SIGKILL (a process in an
// uninterruptible sleep does not die at once).
const killWait = 30 * time.Second

// startProc starts bin with args in dir, its stdout and stderr going to
// log, in a process group of its own (a signal to the daemon's group, such
// as a terminal's ^C, does not reach it: the daemon stops its VMs in
// order), and with the parent-death signal SIGKILL, so that VMs die with
// the daemon, even when it is killed.
//
// The parent-death signal fires when the thread that started the child
// exits, not the process. Go ends a thread only when a goroutine locked to
// it exits, so the goroutine that starts QEMU locks its thread and keeps
// it, waiting for QEMU, until QEMU exited: no other goroutine can lock that
// thread and take it down with it.
func startProc(bin string, args []string, dir string, log *os.File) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// done reports whether QEMU exited.
func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop ends QEMU: SIGTERM (QEMU then exits cleanly), SIGKILL after grace
// or as soon as ctx is done, and waits until it exited. It returns an
// error only when QEMU outlived SIGKILL by killWait.
func (p *proc) stop(ctx context.Context, grace time.Duration) error {
	defer p.closeMux()
	if p.done() {
		return nil
	}
	// os.Process signals through a pidfd: never another process that got
	// the pid after QEMU was reaped.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing QEMU (pid %d): %w", p.pid, err)
	}
	k := time.NewTimer(killWait)
	defer k.Stop()
	select {
	case <-p.exited:
		return nil
	case <-k.C:
		return fmt.Errorf("QEMU (pid %d) still runs %v after SIGKILL", p.pid, killWait)
	}
}
