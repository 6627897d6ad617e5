package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	xssh "golang.org/x/crypto/ssh"
)

// process is a command running in a session channel of its own. Unlike
// x/crypto's Session, it reports the command's end as soon as sshd sends
// the exit status: sshd sends it when the command's process exits, but
// closes the channel only once nobody holds the command's output any
// more, which a process that inherited the output and outlived the
// command can postpone forever.
type process struct {
	ch xssh.Channel
	// exited is closed when sshd reported the command's exit status or
	// the signal that killed it.
	exited chan struct{}
	// closed is closed when the channel is closed and all output was
	// copied.
	closed chan struct{}

	mu     sync.Mutex
	status int
	signal string
}

// start runs cmd in a new session channel; stdout and stderr receive its
// output (each from one goroutine), stdin is sent and then closed. ctx
// bounds the start only.
func (c *client) start(ctx context.Context, cmd string, stdin io.Reader, stdout, stderr io.Writer) (*process, error) {
	type opened struct {
		ch   xssh.Channel
		reqs <-chan *xssh.Request
	}
	o, err := whileUp(ctx, c, func() (opened, error) {
		ch, reqs, err := c.ssh.OpenChannel("session", nil)
		return opened{ch, reqs}, err
	}, func(o opened) { o.ch.Close() })
	if err != nil {
		return nil, err
	}
	p := &process{ch: o.ch, exited: make(chan struct{}), closed: make(chan struct{}), status: -1}
	var copies sync.WaitGroup
	copies.Add(3)
	go func() {
		defer copies.Done()
		for r := range o.reqs {
			p.request(r)
		}
	}()
	go func() {
		defer copies.Done()
		_, _ = io.Copy(stdout, o.ch)
	}()
	go func() {
		defer copies.Done()
		_, _ = io.Copy(stderr, o.ch.Stderr())
	}()
	go func() {
		copies.Wait()
		p.exit(-1, "")
		close(p.closed)
	}()
	ok, err := o.ch.SendRequest("exec", true, xssh.Marshal(&struct{ Command string }{cmd}))
	if err == nil && !ok {
		err = errors.New("the host refused to run the command")
	}
	if err != nil {
		o.ch.Close()
		return nil, c.why(fmt.Errorf("starting a command: %w", err))
	}
	go func() {
		_, _ = io.Copy(o.ch, stdin)
		_ = o.ch.CloseWrite()
	}()
	return p, nil
}

// request handles a channel request of the running command.
func (p *process) request(r *xssh.Request) {
	switch r.Type {
	case "exit-status":
		var m struct{ Status uint32 }
		if xssh.Unmarshal(r.Payload, &m) == nil {
			p.exit(int(m.Status), "")
		}
	case "exit-signal":
		var m struct {
			Signal     string
			CoreDumped bool
			Error      string
			Lang       string
		}
		if xssh.Unmarshal(r.Payload, &m) == nil {
			p.exit(-1, m.Signal)
		}
	}
	if r.WantReply {
		_ = r.Reply(false, nil)
	}
}

// exit records the first exit report.
func (p *process) exit(status int, signal string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	p.status, p.signal = status, signal
	close(p.exited)
}

// result describes how the command ended, for errors.
func (p *process) result() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.signal != "":
		return "killed by SIG" + p.signal
	case p.status >= 0:
		return fmt.Sprintf("exit status %d", p.status)
	}
	return "no exit status"
}

// close gives up on the command: the channel is closed, its output no
// longer read.
func (p *process) close() { _ = p.ch.Close() }
