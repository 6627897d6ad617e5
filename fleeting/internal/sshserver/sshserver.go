// Package sshserver is Berth's own small SSH server (golang.org/x/crypto/ssh):
// enough of OpenSSH for what the connector and the executors need — command
// execution through a shell with streamed stdin/stdout/stderr and exit
// status, environment requests, signals, and forwarding of TCP
// ("direct-tcpip") and unix-socket ("direct-streamlocal@openssh.com")
// connections. No pty, no remote forwarding, no SFTP subsystem. Commands run
// as the user the server runs as. The local fleeting plugin runs one per
// instance.
package sshserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/internal/netpipe"
)

// Server serves SSH on listeners.
type Server struct {
	// HostKey identifies the server. Required.
	HostKey ssh.Signer
	// AuthorizedKeys may log in with public-key authentication.
	AuthorizedKeys []ssh.PublicKey
	// Password, if not empty, may be used for password authentication.
	Password string
	// Username, if not empty, is the only user name accepted.
	Username string
	// Shell runs commands as `Shell -c <command>`; default /bin/sh.
	Shell string
	// Dir is the working directory of commands; default the home directory.
	Dir string
	// Env is the base environment of commands; default os.Environ().
	Env []string
	// Logger receives connection logs. Default: discard.
	Logger *slog.Logger
}

// Serve accepts connections on l until ctx is done or l fails, then closes
// l, ends every session (killing its processes) and returns.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.HostKey == nil {
		return errors.New("sshserver: no host key")
	}
	logger := s.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if !s.userOK(meta.User()) {
				return nil, fmt.Errorf("user %q not allowed", meta.User())
			}
			b := key.Marshal()
			for _, k := range s.AuthorizedKeys {
				if subtle.ConstantTimeCompare(k.Marshal(), b) == 1 {
					return &ssh.Permissions{}, nil
				}
			}
			return nil, errors.New("public key not authorized")
		},
		ServerVersion: "SSH-2.0-BerthSSH_1.0",
	}
	if s.Password != "" {
		cfg.PasswordCallback = func(meta ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) {
			if s.userOK(meta.User()) && subtle.ConstantTimeCompare(pw, []byte(s.Password)) == 1 {
				return &ssh.Permissions{}, nil
			}
			return nil, errors.New("wrong password")
		}
	}
	cfg.AddHostKey(s.HostKey)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		nc, err := l.Accept()
		if err != nil {
			cancel()
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, nc, cfg, logger)
		}()
	}
}

func (s *Server) userOK(u string) bool { return s.Username == "" || u == s.Username }

func (s *Server) serveConn(ctx context.Context, nc net.Conn, cfg *ssh.ServerConfig, logger *slog.Logger) {
	// Bound the handshake so a silent client cannot hold a goroutine.
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	conn, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		logger.Debug("ssh handshake failed", "remote", nc.RemoteAddr().String(), "error", err)
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	logger.Debug("ssh connection", "remote", nc.RemoteAddr().String(), "user", conn.User())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	go func() {
		// Global requests: keepalives and anything else get a refusal,
		// which is a reply (OpenSSH does the same for unknown requests).
		for r := range reqs {
			if r.WantReply {
				r.Reply(false, nil)
			}
		}
	}()
	var wg sync.WaitGroup
	for nch := range chans {
		switch nch.ChannelType() {
		case "session":
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.session(ctx, nch, logger)
			}()
		case "direct-tcpip":
			var m struct {
				Host     string
				Port     uint32
				OrigHost string
				OrigPort uint32
			}
			if err := ssh.Unmarshal(nch.ExtraData(), &m); err != nil || m.Port > 65535 {
				nch.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				forward(ctx, nch, "tcp", net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port))))
			}()
		case "direct-streamlocal@openssh.com":
			var m struct {
				Path      string
				Reserved1 string
				Reserved2 uint32
			}
			if err := ssh.Unmarshal(nch.ExtraData(), &m); err != nil {
				nch.Reject(ssh.ConnectionFailed, "bad direct-streamlocal request")
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				forward(ctx, nch, "unix", m.Path)
			}()
		default:
			nch.Reject(ssh.UnknownChannelType, "unsupported channel type "+nch.ChannelType())
		}
	}
	cancel()
	wg.Wait()
}

// forward connects a forwarding channel to addr on this machine.
func forward(ctx context.Context, nch ssh.NewChannel, network, addr string) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := d.DialContext(dctx, network, addr)
	cancel()
	if err != nil {
		nch.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		c.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	netpipe.Join(ctx, ch, c)
}

// session serves one "session" channel: env, exec or shell, signal.
func (s *Server) session(ctx context.Context, nch ssh.NewChannel, logger *slog.Logger) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	var env []string
	var cmd *exec.Cmd
	for {
		var r *ssh.Request
		select {
		case r = <-reqs:
		case <-ctx.Done():
			return
		}
		if r == nil {
			return // channel closed before a command
		}
		switch r.Type {
		case "env":
			var m struct{ Name, Value string }
			if ssh.Unmarshal(r.Payload, &m) == nil {
				env = append(env, m.Name+"="+m.Value)
			}
			r.Reply(true, nil)
			continue
		case "exec", "shell":
			var command string
			if r.Type == "exec" {
				var m struct{ Command string }
				if ssh.Unmarshal(r.Payload, &m) != nil {
					r.Reply(false, nil)
					continue
				}
				command = m.Command
			}
			cmd = s.command(command, env)
			stdin, err := cmd.StdinPipe()
			if err == nil {
				cmd.Stdout = ch
				cmd.Stderr = ch.Stderr()
				err = cmd.Start()
			}
			if err != nil {
				logger.Warn("starting command", "error", err)
				r.Reply(false, nil)
				return
			}
			r.Reply(true, nil)
			go func() {
				io.Copy(stdin, ch)
				stdin.Close()
			}()
		default:
			// pty-req, x11-req, subsystem, …: not supported.
			if r.WantReply {
				r.Reply(false, nil)
			}
			continue
		}
		break
	}
	// Signals may arrive while the command runs.
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case r := <-reqs:
			if r == nil {
				reqs = nil // client closed its side; keep waiting for the command
				continue
			}
			if r.Type == "signal" {
				var m struct{ Name string }
				if ssh.Unmarshal(r.Payload, &m) == nil {
					if sig, ok := signals[m.Name]; ok {
						syscall.Kill(-cmd.Process.Pid, sig)
					}
				}
			}
			if r.WantReply {
				r.Reply(false, nil)
			}
		case <-ctx.Done():
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waited
			return
		case err := <-waited:
			sendExit(ch, cmd, err)
			return
		}
	}
}

func (s *Server) command(command string, env []string) *exec.Cmd {
	shell := s.Shell
	if shell == "" {
		shell = "/bin/sh"
	}
	var cmd *exec.Cmd
	if command == "" {
		cmd = exec.Command(shell)
	} else {
		cmd = exec.Command(shell, "-c", command)
	}
	base := s.Env
	if base == nil {
		base = os.Environ()
	}
	cmd.Env = append(append([]string(nil), base...), env...)
	cmd.Dir = s.Dir
	if cmd.Dir == "" {
		if h, err := os.UserHomeDir(); err == nil {
			cmd.Dir = h
		}
	}
	// Its own process group, so a signal or the end of the session reaches
	// everything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A process that left the group (setsid, a cgroup move, a daemon)
	// may still hold the session's output open: once the command itself
	// has exited, wait only so long for its output, so neither the
	// session nor the server's shutdown hangs on it.
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

var signals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

func signalName(sig syscall.Signal) string {
	for n, s := range signals {
		if s == sig {
			return n
		}
	}
	return "KILL"
}

func sendExit(ch ssh.Channel, cmd *exec.Cmd, err error) {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Message    string
			Lang       string
		}{signalName(ws.Signal()), ws.CoreDump(), "", ""}))
		return
	}
	code := 0
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	} else if err != nil {
		code = 255
	}
	ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
}
