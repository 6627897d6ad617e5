package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is a component of the system under test (a coordinator or a
// runner manager) run as a child process, so that it can be killed with
// SIGKILL, paused with SIGSTOP and started again exactly as an operator's
// supervisor would.
type process struct {
	name string
	bin  string
	args []string
	env  []string
	log  io.Writer
	// ready, if set, reports whether a started process serves.
	ready func(ctx context.Context) error

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

// start starts the process and waits until it is ready.
func (p *process) start(ctx context.Context) error {
	p.mu.Lock()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// Its own process group: a signal to the driver does not reach it,
	// and the driver alone decides when it dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited, p.paused = cmd, exited, false
	p.mu.Unlock()
	if p.ready == nil {
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := p.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting", p.name)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready: %w", p.name, errors.Join(err, ctx.Err()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signal sends sig to the process.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.paused = true
	case syscall.SIGCONT:
		p.paused = false
	}
	return p.cmd.Process.Signal(sig)
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop ends the process gracefully (SIGCONT if paused, then sig), and
// kills it after grace.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, exited, paused := p.cmd, p.exited, p.paused
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if paused {
		cmd.Process.Signal(syscall.SIGCONT)
	}
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

// pid is the process id of the running process (0 if none).
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}
