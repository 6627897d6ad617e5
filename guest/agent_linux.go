package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/guest/internal/pb"
)

// Agent serves the guest side of the protocol. Root is the job's root
// filesystem (RootDir in a VM; a test may point it at "/" and run
// unchrooted).
type Agent struct {
	pb.UnimplementedAgentServer
	Root    string
	Version string
	Logger  *slog.Logger
	// NoChroot runs scripts without chroot (tests on a host).
	NoChroot bool

	mu sync.Mutex
	// detached are the process groups of running detached runs, spared
	// when a job's leftovers are killed.
	detached map[int]bool
	// stage is the process group of the running job script (0: none).
	stage int
	// pending are accepted connections waiting for their Tunnel.
	pending  map[uint64]net.Conn
	nextConn uint64
}

func (a *Agent) log() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Logger
}

// Hello implements pb.AgentServer.
func (a *Agent) Hello(_ context.Context, req *pb.HelloRequest) (*pb.HelloResponse, error) {
	if n := req.GetUnixNanos(); n > 0 && a.inVM() {
		tv := unix.NsecToTimeval(n)
		if err := unix.Settimeofday(&tv); err != nil {
			a.log().Warn("setting the clock from the host's", "err", err)
		}
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	host, _ := os.Hostname()
	resp := &pb.HelloResponse{Version: a.Version, Kernel: unix.ByteSliceToString(u.Release[:]), Hostname: host, Root: rootSource(a.Root)}
	if b, err := os.ReadFile(filepath.Join(a.Root, ImageConfigPath)); err == nil {
		var ic ImageConfig
		if err := json.Unmarshal(b, &ic); err != nil {
			a.log().Warn("reading the image's configuration", "path", ImageConfigPath, "err", err)
		}
		resp.ImageEnv, resp.ImageWorkingDir, resp.ImageUser = ic.Env, ic.WorkingDir, ic.User
	}
	for _, sh := range []string{"bash", "sh"} {
		for _, dir := range []string{"/bin", "/usr/bin", "/usr/local/bin"} {
			if fi, err := os.Stat(filepath.Join(a.Root, dir, sh)); err == nil && fi.Mode()&0o111 != 0 {
				resp.Shells = append(resp.Shells, sh)
				break
			}
		}
	}
	return resp, nil
}

// rootSource names the device and filesystem mounted at root, from
// /proc/self/mounts.
func rootSource(root string) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	src := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == root {
			src = f[0] + " (" + f[2] + ")"
		}
	}
	return src
}

// Run implements pb.AgentServer.
func (a *Agent) Run(stream grpc.BidiStreamingServer[pb.RunInput, pb.RunEvent]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil || len(start.GetArgv()) == 0 {
		return stream.Send(failure(pb.Failure_SYSTEM, "protocol: the first message of Run must be start, with argv"))
	}
	detached := start.GetDetached()
	// removeScript removes the script file; it runs before the last
	// event is sent, so a client that has the exit status finds it gone.
	removeScript := func() {}
	if start.GetScript() != "" || start.GetScriptPath() != "" {
		p := filepath.Join(a.Root, filepath.Clean("/"+start.GetScriptPath()))
		if err := os.WriteFile(p, []byte(start.GetScript()), 0o700); err != nil {
			return stream.Send(failure(pb.Failure_SYSTEM, fmt.Sprintf("writing the script: %v", err)))
		}
		var once sync.Once
		removeScript = func() { once.Do(func() { os.Remove(p) }) }
		defer removeScript()
	}
	cmd := exec.Command(start.GetArgv()[0], start.GetArgv()[1:]...)
	cmd.Env = start.GetEnv()
	cmd.Dir = start.GetDir()
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !a.NoChroot {
		cmd.SysProcAttr.Chroot = a.Root
	} else if !filepath.IsAbs(cmd.Dir) || a.Root != "/" {
		cmd.Dir = filepath.Join(a.Root, cmd.Dir)
	}
	var stdin *os.File // the host's end of a streamed stdin
	if start.GetStdinStream() {
		r, w, err := os.Pipe()
		if err != nil {
			return stream.Send(failure(pb.Failure_SYSTEM, err.Error()))
		}
		defer r.Close()
		cmd.Stdin, stdin = r, w
		defer stdin.Close()
	} else if in := start.GetStdin(); len(in) > 0 {
		cmd.Stdin = bytes.NewReader(in)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return stream.Send(failure(pb.Failure_SYSTEM, err.Error()))
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if !detached {
		a.mu.Lock()
		busy := a.stage != 0
		a.mu.Unlock()
		if busy {
			pr.Close()
			pw.Close()
			return stream.Send(failure(pb.Failure_SYSTEM, "another job script is running"))
		}
	}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return stream.Send(failure(pb.Failure_SYSTEM, fmt.Sprintf("starting %s: %v", start.GetArgv()[0], err)))
	}
	pw.Close()
	if f, ok := cmd.Stdin.(*os.File); ok {
		f.Close() // the child has it
	}
	pgid := cmd.Process.Pid
	a.track(pgid, detached, true)
	untrack := sync.OnceFunc(func() { a.track(pgid, detached, false) })
	defer untrack()

	grace := time.Duration(start.GetGraceMillis()) * time.Millisecond
	if grace <= 0 {
		grace = DefaultGrace
	}
	canceled := make(chan string, 1)
	go func() {
		for {
			in, err := stream.Recv()
			if err != nil {
				if stdin != nil {
					stdin.Close()
				}
				select {
				case canceled <- "the host went away":
				default:
				}
				return
			}
			if c := in.GetCancel(); c != nil {
				select {
				case canceled <- c.GetReason():
				default:
				}
			}
			if d, ok := in.GetInput().(*pb.RunInput_Stdin); ok && stdin != nil {
				if len(d.Stdin) == 0 {
					stdin.Close()
				} else if _, err := stdin.Write(d.Stdin); err != nil {
					stdin.Close() // the command stopped reading
				}
			}
		}
	}()
	// Output, in order, as it comes.
	var sendMu sync.Mutex
	send := func(ev *pb.RunEvent) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(ev)
	}
	copied := make(chan struct{})
	// draining: the run is over but processes it left (keep_processes)
	// still hold its output: read on, without the host, so their writes
	// do not fail, until they end.
	var draining atomic.Bool
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 && !draining.Load() {
				_ = send(&pb.RunEvent{Event: &pb.RunEvent_Output{Output: bytes.Clone(buf[:n])}})
			}
			if err != nil {
				if draining.Load() {
					pr.Close()
				}
				return
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var werr error
	reason := ""
	select {
	case werr = <-exited:
	case reason = <-canceled:
		a.log().Info("stopping a script", "reason", reason)
		a.signalJob(pgid, detached, syscall.SIGTERM)
		t := time.NewTimer(grace)
		select {
		case werr = <-exited:
		case <-t.C:
			a.signalJob(pgid, detached, syscall.SIGKILL)
			werr = <-exited
		}
		t.Stop()
	}
	// Whatever the script left behind goes with it, unless the next
	// script continues this one.
	keep := start.GetKeepProcesses() && !detached && reason == ""
	wait := 5 * time.Second
	if keep {
		wait = 200 * time.Millisecond
	} else {
		a.killLeftovers(pgid, detached)
	}
	select {
	case <-copied:
	case <-time.After(wait):
	}
	if keep {
		draining.Store(true)
	} else {
		pr.Close()
		<-copied
	}
	removeScript()
	// Done before the host hears the end: it may start the next script
	// at once, which must not find this one still running.
	untrack()
	if reason != "" {
		return send(failure(pb.Failure_CANCELED, "stopped: "+reason))
	}
	var ee *exec.ExitError
	switch {
	case werr == nil:
		return send(&pb.RunEvent{Event: &pb.RunEvent_Exit{Exit: &pb.Exit{Code: 0}}})
	case errors.As(werr, &ee):
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return send(&pb.RunEvent{Event: &pb.RunEvent_Exit{Exit: &pb.Exit{Code: int32(code)}}})
	}
	return send(failure(pb.Failure_SYSTEM, werr.Error()))
}

func failure(kind pb.Failure_Kind, msg string) *pb.RunEvent {
	return &pb.RunEvent{Event: &pb.RunEvent_Failure{Failure: &pb.Failure{Kind: kind, Message: msg}}}
}

func (a *Agent) track(pgid int, detached, add bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detached == nil {
		a.detached = map[int]bool{}
	}
	switch {
	case detached && add:
		a.detached[pgid] = true
	case detached:
		delete(a.detached, pgid)
	case add:
		a.stage = pgid
	default:
		a.stage = 0
	}
}

// signalJob signals a run's processes: a detached run's process group; a
// job script's process group and every other process of the VM that is
// not spared (jobProcesses).
func (a *Agent) signalJob(pgid int, detached bool, sig syscall.Signal) {
	_ = syscall.Kill(-pgid, sig)
	if detached || a.NoChroot {
		return
	}
	for _, pid := range a.jobProcesses() {
		_ = syscall.Kill(pid, sig)
	}
}

// killLeftovers kills what a run left: its process group, and for a job
// script every process jobProcesses finds, until none is left.
func (a *Agent) killLeftovers(pgid int, detached bool) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if detached || a.NoChroot {
		return
	}
	for range 50 {
		pids := a.jobProcesses()
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// jobProcesses are the processes of the VM a job may have started: all
// but init, the agent (this process), kernel threads, zombies, and the
// process groups of running detached runs.
func (a *Agent) jobProcesses() []int {
	a.mu.Lock()
	spare := make(map[int]bool, len(a.detached))
	for g := range a.detached {
		spare[g] = true
	}
	a.mu.Unlock()
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[0] state, f[1] ppid, f[2] pgrp, f[6] flags.
		if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&0x00200000 != 0 { // PF_KTHREAD
			continue
		}
		if pgrp, _ := strconv.Atoi(f[2]); spare[pgrp] {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// Listen implements pb.AgentServer.
func (a *Agent) Listen(req *pb.ListenRequest, stream grpc.ServerStreamingServer[pb.Accepted]) error {
	l, err := a.listen(req.GetAddr())
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "listen on %s: %v", req.GetAddr(), err)
	}
	ctx := stream.Context()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	if err := stream.Send(&pb.Accepted{}); err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return status.Errorf(codes.Unavailable, "accept on %s: %v", req.GetAddr(), err)
		}
		a.mu.Lock()
		if a.pending == nil {
			a.pending = map[uint64]net.Conn{}
		}
		a.nextConn++
		id := a.nextConn
		a.pending[id] = c
		a.mu.Unlock()
		// A connection the host never tunnels is dropped.
		time.AfterFunc(time.Minute, func() {
			if c := a.takePending(id); c != nil {
				c.Close()
			}
		})
		if err := stream.Send(&pb.Accepted{Id: id}); err != nil {
			if c := a.takePending(id); c != nil {
				c.Close()
			}
			return err
		}
	}
}

// listen listens on addr as the job will connect to it: a host name is
// made to mean the loopback in the job's /etc/hosts; an IP address the
// VM does not have is added to the loopback interface.
func (a *Agent) listen(addr string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		if a.NoChroot {
			return nil, fmt.Errorf("%s is a host name: only a VM's agent maps names", host)
		}
		if err := addHost(filepath.Join(a.Root, "etc/hosts"), host); err != nil {
			return nil, err
		}
		return net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	}
	l, err := net.Listen("tcp", addr)
	if err == nil || !errors.Is(err, syscall.EADDRNOTAVAIL) || a.NoChroot {
		return l, err
	}
	bits := "/32"
	if ip.To4() == nil {
		bits = "/128"
	}
	if out, err := exec.Command("/bin/ip", "addr", "add", host+bits, "dev", "lo").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("adding %s to the loopback: %v: %s", host, err, bytes.TrimSpace(out))
	}
	return net.Listen("tcp", addr)
}

// addHost makes name resolve to the loopback in the hosts file p (first
// match wins in /etc/hosts, so the line goes first).
func addHost(p, name string) error {
	old, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	line := "127.0.0.1 " + name + " # berth: the coordinator, through the agent\n"
	if bytes.Contains(old, []byte(line)) {
		return nil
	}
	// Replaced, never written through: the image's file may be a link.
	tmp := p + ".berth"
	if err := os.WriteFile(tmp, append([]byte(line), old...), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (a *Agent) takePending(id uint64) net.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.pending[id]
	delete(a.pending, id)
	return c
}

// Tunnel implements pb.AgentServer.
func (a *Agent) Tunnel(stream grpc.BidiStreamingServer[pb.Chunk, pb.Chunk]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	c := a.takePending(first.GetId())
	if c == nil {
		return status.Errorf(codes.NotFound, "no pending connection %d", first.GetId())
	}
	defer c.Close()
	if len(first.GetData()) > 0 {
		if _, err := c.Write(first.GetData()); err != nil {
			return nil
		}
	}
	return pump(c, stream)
}

// Poweroff implements pb.AgentServer: the VM stops shortly after the
// answer is out.
func (a *Agent) Poweroff(context.Context, *pb.PoweroffRequest) (*pb.PoweroffResponse, error) {
	go func() {
		time.Sleep(100 * time.Millisecond)
		unix.Sync()
		if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
			a.log().Error("power off", "err", err)
		}
	}()
	return &pb.PoweroffResponse{}, nil
}
