package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/internal/flock"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/vmimage"
)

// deleteGrace is how long QEMU gets to exit on SIGTERM before SIGKILL.
const deleteGrace = 5 * time.Second

// waitInterval is how often Create says hello to a booting guest.
const waitInterval = 200 * time.Millisecond

// Hypervisor is the QEMU nesting.Hypervisor: one QEMU process per VM.
// Create it with New. Safe for concurrent use.
type Hypervisor struct {
	log *slog.Logger

	// Set by New; tests change them before first use.
	kvmDevice string
	procDir   string
	probe     func(ctx context.Context, s *setup) error

	// life serializes Init and Shutdown.
	life chan struct{}
	mu   sync.Mutex
	// inits are the Inits in flight, which Shutdown cancels (it does not
	// wait for a KVM probe to time out).
	inits map[*context.CancelFunc]struct{}
	setup *setup // nil: not initialized
	vms   map[string]*vm
	// ops are the Creates and Deletes in flight, with the VM ID each is
	// about; Shutdown waits for them.
	ops map[*op]string
}

var _ nesting.Hypervisor = (*Hypervisor)(nil)

// setup is what Init made of a config; it lives until Shutdown.
type setup struct {
	cfg     Config // StateDir absolute
	qemu    string // absolute paths of the programs
	qemuImg string
	store   *vmimage.Store
	boot    *vmimage.Boot
	accel   string // AccelKVM or AccelTCG
	// accelReason says why.
	accelReason string
	// accelCache is the directory of the KVM probe's results.
	accelCache string
	lock       *os.File // StateDir/daemon.lock, flock(2)ed
	// making are the templates being made, by key (closed when done);
	// failed when a key's last attempt failed. Under Hypervisor.mu.
	making map[string]chan struct{}
	failed map[string]time.Time
	// branches are the branch points, by id; branching counts the
	// Branches in flight (both bounded by MaxBranches). Under
	// Hypervisor.mu.
	branches  map[string]*branchPoint
	branching int
}

// vm is a VM that Create returned.
type vm struct {
	nesting.VirtualMachine
	// bootID is the host name its kernel was booted with (a template's
	// for a restored VM); memBackend says its memory is the backend
	// "mem" (restored VMs), which a snapshot of it must say.
	bootID     string
	memBackend bool
	// shape is what its QEMU was started with (a VM resumed from a
	// bundle has the bundle's), which a snapshot of it must record.
	shape    shape
	dir      string
	proc     *proc
	deleting atomic.Bool
}

// shape is what QEMU must be given again to load a VM's saved state:
// its machine, accelerator, size, network, kernel and initramfs.
type shape struct {
	machine, accel, network string
	cpus, memoryMB          int
	kernel, initrd          string
}

// shape is the shape of the VMs Create makes.
func (s *setup) shape() shape {
	return shape{machine: s.cfg.Machine, accel: s.accel, network: s.cfg.Network, cpus: s.cfg.CPUs, memoryMB: s.cfg.MemoryMB,
		kernel: s.boot.BootKernel(), initrd: s.boot.Initramfs}
}

// spec is the QEMU of VM id of this shape in dir, with its disk and QMP
// socket there; the caller adds the rest.
func (sh shape) spec(id, dir string) vmSpec {
	return vmSpec{id: id, dir: dir, machine: sh.machine, accel: sh.accel, cpus: sh.cpus, memoryMB: sh.memoryMB, network: sh.network,
		kernel: sh.kernel, initrd: sh.initrd, disk: filepath.Join(dir, overlayFile), qmp: filepath.Join(dir, qmpFile)}
}

// op is a Create or Delete in flight.
type op struct {
	cancel context.CancelCauseFunc // nil for a Delete
	done   chan struct{}
}

// begin registers an op on VM id; the caller holds h.mu and calls end
// when the op is over.
func (h *Hypervisor) begin(id string, cancel context.CancelCauseFunc) *op {
	o := &op{cancel: cancel, done: make(chan struct{})}
	h.ops[o] = id
	return o
}

func (h *Hypervisor) end(o *op) {
	h.mu.Lock()
	delete(h.ops, o)
	h.mu.Unlock()
	close(o.done)
}

// taken reports whether id is in use; the caller holds h.mu.
func (h *Hypervisor) taken(id string) bool {
	if h.vms[id] != nil {
		return true
	}
	for _, oid := range h.ops {
		if oid == id {
			return true
		}
	}
	return false
}

// errShutdown is the cause of the Creates that Shutdown cancels.
var errShutdown = errors.New("the hypervisor is shutting down")

// New returns an uninitialized QEMU hypervisor that logs to log (nil:
// nowhere).
func New(log *slog.Logger) *Hypervisor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hypervisor{
		log:       log,
		kvmDevice: "/dev/kvm",
		procDir:   "/proc",
		life:      make(chan struct{}, 1),
		inits:     map[*context.CancelFunc]struct{}{},
		vms:       map[string]*vm{},
		ops:       map[*op]string{},
	}
	h.probe = h.probeKVM
	return h
}

// acquire takes the Init/Shutdown lock, or fails when ctx is done.
func (h *Hypervisor) acquire(ctx context.Context) error {
	select {
	case h.life <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Hypervisor) release() { <-h.life }

// Init parses the config (ParseConfig), finds QEMU and qemu-img, takes
// the state directory (StateDir/daemon.lock: one daemon per state
// directory), stops and removes what an earlier daemon left in
// StateDir/vms, makes the initramfs (vmimage.Store.BootFiles, with the
// running berth as the agent) and chooses the accelerator.
func (h *Hypervisor) Init(ctx context.Context, config []byte) error {
	cfg, err := ParseConfig(config)
	if err != nil {
		return err
	}
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	h.mu.Lock()
	h.inits[&cancel] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.inits, &cancel)
		h.mu.Unlock()
	}()
	if err := h.acquire(ictx); err != nil {
		return fmt.Errorf("qemu: init: %w", h.initError(ctx, err))
	}
	defer h.release()
	h.mu.Lock()
	initialized := h.setup != nil
	h.mu.Unlock()
	if initialized {
		return fmt.Errorf("qemu: init: %w", nesting.ErrAlreadyInitialized)
	}
	s, err := h.init(ictx, cfg)
	if err != nil {
		return fmt.Errorf("qemu: init: %w", h.initError(ctx, err))
	}
	h.mu.Lock()
	h.setup = s
	h.mu.Unlock()
	h.prewarm(s)
	return nil
}

// initError says that a Shutdown canceled an Init, when it did.
func (h *Hypervisor) initError(ctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", errShutdown, err)
	}
	return err
}

func (h *Hypervisor) init(ctx context.Context, cfg Config) (_ *setup, err error) {
	if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	if cfg.TemplateDir, err = filepath.Abs(cfg.TemplateDir); err != nil {
		return nil, fmt.Errorf("template_dir: %w", err)
	}
	s := &setup{cfg: cfg, store: &vmimage.Store{Dir: cfg.ImageDir, Logger: h.log},
		making: map[string]chan struct{}{}, failed: map[string]time.Time{}, branches: map[string]*branchPoint{}}
	if s.qemu, err = lookPath("qemu", cfg.QEMU, "qemu-system-x86"); err != nil {
		return nil, err
	}
	if s.qemuImg, err = lookPath("qemu_img", cfg.QEMUImg, "qemu-utils"); err != nil {
		return nil, err
	}
	vmsDir := filepath.Join(cfg.StateDir, "vms")
	if err := os.MkdirAll(vmsDir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	if s.lock, err = lockStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.lock.Close()
		}
	}()
	if err := h.cleanLeftovers(vmsDir); err != nil {
		// Leftovers do not get in the way of new VMs (new IDs); a
		// process that cannot be stopped needs the operator.
		h.log.Error("cleaning up after an earlier daemon", "err", err)
	}
	// Branch points are a daemon's own: an earlier one's are gone with
	// its VMs.
	if err := os.RemoveAll(filepath.Join(cfg.StateDir, branchesDir)); err != nil {
		h.log.Error("removing an earlier daemon's branch points", "err", err)
	}
	// A template being installed when an earlier daemon died.
	tmps, _ := filepath.Glob(filepath.Join(cfg.TemplateDir, "tmp-*"))
	for _, t := range tmps {
		removeStaleTmp(t)
	}
	agent := cfg.Agent
	if agent == "" {
		if agent, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("finding the guest agent (this berth binary): %w", err)
		}
	}
	if s.boot, err = s.store.BootFiles(ctx, vmimage.BootOptions{Agent: agent, Kernel: cfg.Kernel}); err != nil {
		if cfg.Kernel != "" {
			return nil, fmt.Errorf("kernel %s: %w", cfg.Kernel, err)
		}
		return nil, err
	}
	root, err := s.store.Root()
	if err != nil {
		return nil, fmt.Errorf("image_dir: %w", err)
	}
	s.accelCache = filepath.Join(root, "accel")
	accel, reason, err := h.chooseAccel(ctx, s)
	if err != nil {
		return nil, err
	}
	s.accel, s.accelReason = accel, reason
	h.log.Info("qemu hypervisor ready", "accel", accel, "why", reason, "machine", cfg.Machine,
		"cpus", cfg.CPUs, "memory_mb", cfg.MemoryMB, "network", cfg.Network, "state_dir", cfg.StateDir,
		"kernel", s.boot.BootKernel(), "initramfs", s.boot.Initramfs, "qemu", s.qemu)
	return s, nil
}

// lookPath finds a program of the config key key, suggesting the Debian
// package that has it.
func lookPath(key, prog, pkg string) (string, error) {
	p, err := exec.LookPath(prog)
	if err != nil {
		return "", fmt.Errorf("%s: %w (Debian: apt-get install %s)", key, err, pkg)
	}
	if p, err = filepath.Abs(p); err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	return p, nil
}

// lockStateDir takes dir/daemon.lock (flock(2), released by the kernel
// when the process dies) and writes this process's pid in it. A second
// daemon on the same directory would stop the first one's VMs as
// leftovers.
func lockStateDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, "daemon.lock")
	f, err := flock.TryLock(p, 0o600)
	if errors.Is(err, flock.ErrLocked) {
		holder, _ := os.ReadFile(p)
		return nil, fmt.Errorf("state_dir %s is in use by another nesting daemon (pid %s): give each daemon a state_dir of its own", dir, strings.TrimSpace(string(holder)))
	}
	if err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// Create makes a VM of image name: the image's root filesystem (built
// from the Docker engine when build_missing is set, else looked up in the
// store), a qcow2 overlay of it in StateDir/vms/<id>/, and a QEMU booting
// the kernel and initramfs with it as /dev/vda. It returns once the
// guest's agent answers on the VM's socket; Addr is "unix://" and the
// socket's path. Anything that fails, or ctx ending, or Shutdown, stops
// QEMU and removes the directory.
func (h *Hypervisor) Create(ctx context.Context, name string) (nesting.VirtualMachine, error) {
	if err := ctx.Err(); err != nil {
		return nesting.VirtualMachine{}, fmt.Errorf("qemu: creating a VM of %q: %w", name, err)
	}
	if name == "" {
		return nesting.VirtualMachine{}, errors.New("qemu: creating a VM: no image name")
	}
	return h.makeVM(ctx, fmt.Sprintf("of %q", name), func(ctx context.Context, s *setup, id, dir string) (*vm, error) {
		return h.create(ctx, s, id, dir, name)
	})
}

// makeVM runs mk for a new VM id and its new directory dir (removed if
// mk fails) as an op Shutdown cancels and waits for, and keeps the VM it
// made; what says what the VM is made of, for errors.
func (h *Hypervisor) makeVM(ctx context.Context, what string, mk func(ctx context.Context, s *setup, id, dir string) (*vm, error)) (nesting.VirtualMachine, error) {
	h.mu.Lock()
	s := h.setup
	if s == nil {
		h.mu.Unlock()
		return nesting.VirtualMachine{}, fmt.Errorf("qemu: creating a VM %s: %w", what, nesting.ErrNotInitialized)
	}
	id := nesting.NewID()
	for h.taken(id) {
		id = nesting.NewID()
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	o := h.begin(id, cancel)
	h.mu.Unlock()
	defer h.end(o)

	dir := vmDir(s.cfg.StateDir, id)
	err := os.Mkdir(dir, 0o700)
	var v *vm
	if err == nil {
		if v, err = mk(cctx, s, id, dir); err != nil {
			os.RemoveAll(dir)
		}
	} else {
		err = fmt.Errorf("making the VM directory: %w", err)
	}
	if err != nil {
		// Make sure the cause of an early end is in the chain.
		for _, cause := range []error{ctx.Err(), context.Cause(cctx)} {
			if cause != nil && !errors.Is(err, cause) {
				err = fmt.Errorf("%w: %w", cause, err)
				break
			}
		}
		return nesting.VirtualMachine{}, fmt.Errorf("qemu: creating VM %s %s: %w", id, what, err)
	}
	h.mu.Lock()
	if h.setup != s {
		// Shut down while it booted: Shutdown waits for this op and no
		// longer sees the VM, so it goes here.
		h.mu.Unlock()
		h.destroy(context.WithoutCancel(ctx), v)
		return nesting.VirtualMachine{}, fmt.Errorf("qemu: creating VM %s %s: %w", id, what, errShutdown)
	}
	h.vms[id] = v
	h.mu.Unlock()
	return v.VirtualMachine, nil
}

// create makes VM id of image name in dir.
func (h *Hypervisor) create(ctx context.Context, s *setup, id, dir, name string) (*vm, error) {
	start := time.Now()
	img, err := h.image(ctx, s, name)
	if err != nil {
		return nil, err
	}
	tmpl, err := h.warmTemplate(ctx, s, img, name)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		h.log.Error("making a VM template: VMs of this image boot cold for now", "image", name, "err", err)
	}
	bootStart := time.Now()
	if tmpl != nil {
		p, err := h.restore(ctx, s, tmpl, id, dir)
		if err == nil {
			v := &vm{VirtualMachine: nesting.VirtualMachine{ID: id, Name: name, Addr: "unix://" + socketPath(dir)}, dir: dir, proc: p,
				bootID: tmpl.meta.BootID, memBackend: true, shape: s.shape()}
			go h.watch(v)
			h.log.Info("VM created", "id", id, "image", name, "digest", img.Digest, "pid", p.pid, "addr", v.Addr,
				"restored", time.Since(bootStart).Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond),
				"template", tmpl.meta.Key)
			return v, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		h.log.Error("restoring a VM from its template: booting it instead", "id", id, "image", name, "template", tmpl.dir, "err", err)
		h.mu.Lock()
		s.failed[tmpl.meta.Key] = time.Now()
		h.mu.Unlock()
		if err := resetDir(dir); err != nil {
			return nil, err
		}
		bootStart = time.Now()
	}
	spec := s.shape().spec(id, dir)
	if err := h.overlay(ctx, s, img.Path, "raw", spec.disk); err != nil {
		return nil, err
	}
	p, info, err := h.boot(ctx, s, spec, s.cfg.BootTimeout)
	if err != nil {
		return nil, err
	}
	v := &vm{VirtualMachine: nesting.VirtualMachine{ID: id, Name: name, Addr: "unix://" + socketPath(dir)}, dir: dir, proc: p, bootID: id,
		shape: s.shape()}
	go h.watch(v)
	h.log.Info("VM created", "id", id, "image", name, "digest", img.Digest, "pid", p.pid, "addr", v.Addr,
		"boot", time.Since(bootStart).Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond),
		"guest_kernel", info.Kernel, "root", info.Root)
	return v, nil
}

// resetDir empties a VM directory for another attempt.
func resetDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Mkdir(dir, 0o700)
}

// image returns the root filesystem of image name.
func (h *Hypervisor) image(ctx context.Context, s *setup, name string) (*vmimage.Image, error) {
	if s.cfg.BuildMissing {
		return s.store.Build(ctx, name, vmimage.BuildOptions{})
	}
	img, err := s.store.Lookup(name)
	if errors.Is(err, vmimage.ErrNotBuilt) {
		return nil, fmt.Errorf("%w: build_missing is false, so run `berth image build %s` on this host first (image_dir %q)", err, name, s.cfg.ImageDir)
	}
	return img, err
}

// watch logs a VM's QEMU exiting by itself (the guest powered off or
// crashed). The VM stays listed until it is deleted.
func (h *Hypervisor) watch(v *vm) {
	<-v.proc.exited
	if v.deleting.Load() {
		return
	}
	h.log.Warn("a VM's QEMU exited by itself", "id", v.ID, "image", v.Name, "status", exitStatus(v.proc.err),
		"console", tail(filepath.Join(v.dir, consoleFile), 20))
}

// errBootTimeout and errQEMUExited are the causes of a failed boot.
type errBootTimeout struct{ d time.Duration }

func (e errBootTimeout) Error() string {
	return fmt.Sprintf("the guest agent did not answer within %v (boot_timeout)", e.d)
}

type errQEMUExited struct{ err error }

func (e errQEMUExited) Error() string {
	return "QEMU exited (" + exitStatus(e.err) + ") before the guest agent answered"
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// bootError is a boot that failed, with the ends of QEMU's output and of
// the guest's console.
type bootError struct {
	cause   error
	stderr  string // the last lines of qemu.log
	console string // the last lines of console.log
}

func (e *bootError) Error() string {
	var b strings.Builder
	b.WriteString(e.cause.Error())
	if e.stderr != "" {
		b.WriteString("\nQEMU's output (qemu.log):\n" + e.stderr)
	}
	if e.console != "" {
		b.WriteString("\nthe guest's console (last lines of console.log):\n" + e.console)
	} else {
		b.WriteString("\nthe guest's console is empty")
	}
	return b.String()
}

func (e *bootError) Unwrap() error { return e.cause }

// boot starts QEMU for spec and waits, at most timeout, until the guest's
// agent answers Hello. On error QEMU is stopped (the caller removes the
// directory).
func (h *Hypervisor) boot(ctx context.Context, s *setup, spec vmSpec, timeout time.Duration) (*proc, guest.Info, error) {
	logf, err := os.OpenFile(filepath.Join(spec.dir, qemuLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, guest.Info{}, err
	}
	defer logf.Close() // QEMU has its own copy
	args := argv(spec)
	h.log.Debug("starting QEMU", "id", spec.id, "argv", append([]string{s.qemu}, args...))
	p, err := startProc(s.qemu, args, spec.dir, logf)
	if err != nil {
		return nil, guest.Info{}, fmt.Errorf("starting %s: %w", s.qemu, err)
	}
	if err := os.WriteFile(filepath.Join(spec.dir, pidFile), []byte(strconv.Itoa(p.pid)+"\n"), 0o600); err != nil {
		h.stopQuietly(p)
		return nil, guest.Info{}, err
	}
	bctx, cancel := context.WithTimeoutCause(ctx, timeout, errBootTimeout{timeout})
	defer cancel()
	wctx, cancelWait := context.WithCancelCause(bctx)
	defer cancelWait(nil)
	go func() {
		select {
		case <-p.exited:
			cancelWait(errQEMUExited{p.err})
		case <-wctx.Done():
		}
	}()
	if spec.incoming != "" {
		err = incoming(wctx, spec.qmp, spec.incoming, spec.ignoreShared)
	}
	if err == nil {
		p.mux, err = serveAgent(wctx, spec.dir)
	}
	if err != nil {
		h.stopQuietly(p)
		if cause := context.Cause(wctx); cause != nil {
			err = cause
		}
		if ctx.Err() != nil {
			return nil, guest.Info{}, err
		}
		return nil, guest.Info{}, &bootError{cause: err,
			stderr:  tail(filepath.Join(spec.dir, qemuLogFile), 20),
			console: tail(filepath.Join(spec.dir, consoleFile), 20)}
	}
	sock := socketPath(spec.dir)
	c, err := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		h.stopQuietly(p)
		return nil, guest.Info{}, err
	}
	if spec.incoming != "" {
		// A restored guest: its new name, clock and entropy before
		// anything else.
		if err = c.Restored(wctx, spec.id); err != nil {
			c.Close()
			h.stopQuietly(p)
			if cause := context.Cause(wctx); cause != nil && ctx.Err() != nil {
				return nil, guest.Info{}, cause
			}
			return nil, guest.Info{}, &bootError{cause: err,
				stderr:  tail(filepath.Join(spec.dir, qemuLogFile), 20),
				console: tail(filepath.Join(spec.dir, consoleFile), 20)}
		}
	}
	info, err := c.Wait(wctx, waitInterval)
	c.Close()
	if err == nil {
		return p, info, nil
	}
	cause := context.Cause(wctx)
	if cause == nil {
		cause = err
	}
	h.stopQuietly(p)
	if ctx.Err() != nil {
		// Canceled by the caller: no diagnosis needed.
		return nil, guest.Info{}, cause
	}
	return nil, guest.Info{}, &bootError{cause: cause,
		stderr:  tail(filepath.Join(spec.dir, qemuLogFile), 20),
		console: tail(filepath.Join(spec.dir, consoleFile), 20)}
}

// serveAgent connects to the agent's port once QEMU made it and serves
// the agent on the VM's socket (guest.HostMux): the port takes one
// client, the socket any number.
func serveAgent(ctx context.Context, dir string) (*guest.HostMux, error) {
	var port net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", portPath(dir))
		if err == nil {
			port = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to the agent's port: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	l, err := net.Listen("unix", socketPath(dir))
	if err != nil {
		port.Close()
		return nil, fmt.Errorf("serving the agent: %w", err)
	}
	m, err := guest.NewHostMux(port, l)
	if err != nil {
		port.Close()
		l.Close()
		return nil, err
	}
	return m, nil
}

// stopQuietly stops a QEMU that failed to become a VM, logging a failure.
func (h *Hypervisor) stopQuietly(p *proc) {
	if err := p.stop(context.Background(), 0); err != nil {
		h.log.Error("stopping a QEMU that did not boot", "pid", p.pid, "err", err)
	}
}

// tail returns the last n lines of file p ("" if it cannot be read),
// reading at most its last 64 KiB.
func tail(p string, n int) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 64 << 10
	var off int64
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		off = fi.Size() - max
	}
	buf := make([]byte, max)
	k, _ := f.ReadAt(buf, off)
	s := strings.TrimRight(strings.ReplaceAll(string(buf[:k]), "\r", ""), "\n")
	lines := strings.Split(s, "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // a partial line
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	return strings.Join(lines, "\n")
}

// Delete stops the VM's QEMU (SIGTERM, SIGKILL after 5 s or when ctx
// ends) and removes its directory. An unknown id wraps
// nesting.ErrNotFound.
func (h *Hypervisor) Delete(ctx context.Context, id string) error {
	h.mu.Lock()
	v := h.vms[id]
	if v == nil {
		h.mu.Unlock()
		return fmt.Errorf("qemu: deleting VM %q: %w", id, nesting.ErrNotFound)
	}
	delete(h.vms, id)
	o := h.begin(id, nil)
	h.mu.Unlock()
	defer h.end(o)
	if err := h.destroy(ctx, v); err != nil {
		return fmt.Errorf("qemu: deleting VM %s: %w", id, err)
	}
	return nil
}

// destroy stops v's QEMU and removes its directory.
func (h *Hypervisor) destroy(ctx context.Context, v *vm) error {
	v.deleting.Store(true)
	err := v.proc.stop(ctx, deleteGrace)
	if rerr := os.RemoveAll(v.dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		h.log.Error("deleting a VM", "id", v.ID, "err", err)
		return err
	}
	h.log.Info("VM deleted", "id", v.ID, "image", v.Name)
	return nil
}

// List returns the VMs this hypervisor runs (those of an earlier daemon
// were stopped by Init), by ID.
func (h *Hypervisor) List(ctx context.Context) ([]nesting.VirtualMachine, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("qemu: listing VMs: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]nesting.VirtualMachine, 0, len(h.vms))
	for _, v := range h.vms {
		out = append(out, v.VirtualMachine)
	}
	slices.SortFunc(out, func(a, b nesting.VirtualMachine) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Shutdown cancels the Creates in flight and waits for them, deletes
// every VM and releases the state directory; the hypervisor is then
// uninitialized. It may be called at any time (before Init, twice,
// concurrently). When ctx ends, QEMUs are killed without their grace
// period.
func (h *Hypervisor) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	for cancel := range h.inits {
		(*cancel)()
	}
	h.mu.Unlock()
	if err := h.acquire(ctx); err != nil {
		return fmt.Errorf("qemu: shutdown: waiting for Init or another Shutdown: %w", err)
	}
	defer h.release()
	h.mu.Lock()
	s := h.setup
	h.setup = nil
	var pending []*op
	for o := range h.ops {
		if o.cancel != nil {
			o.cancel(errShutdown)
		}
		pending = append(pending, o)
	}
	h.mu.Unlock()
	// A Create that is canceled stops its QEMU; one that finishes sees
	// that the hypervisor was shut down and deletes its VM itself.
	var errs []error
	for _, o := range pending {
		select {
		case <-o.done:
			continue
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("VM creations and deletions still running: %w", ctx.Err()))
		}
		break
	}
	h.mu.Lock()
	vms := h.vms
	h.vms = map[string]*vm{}
	h.mu.Unlock()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, v := range vms {
		wg.Go(func() {
			if err := h.destroy(ctx, v); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("VM %s: %w", v.ID, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if s != nil {
		if err := dropBranches(s); err != nil {
			errs = append(errs, fmt.Errorf("branch points: %w", err))
		}
		// The state directory is another daemon's to take once the ops
		// in flight are over: now, unless ctx ended before they were.
		release := func() {
			for _, o := range pending {
				<-o.done
			}
			s.lock.Close()
		}
		if ctx.Err() == nil {
			release()
		} else {
			go release()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("qemu: shutdown: %w", err)
	}
	return nil
}

// randomSuffix is 8 chars of [a-z0-9], as in VM IDs.
func randomSuffix() string { return strings.TrimPrefix(nesting.NewID(), nesting.IDPrefix) }

// Accel is the accelerator Init chose ("" before Init) and why.
func (h *Hypervisor) Accel() (accel, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.setup == nil {
		return "", ""
	}
	return h.setup.accel, h.setup.accelReason
}

// PID is the process id of VM id's QEMU.
func (h *Hypervisor) PID(id string) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.vms[id]
	if v == nil {
		return 0, false
	}
	return v.proc.pid, true
}
