package nesting

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/berthci/berth/nesting/internal/pb"
)

// Server is a nesting daemon over a Hypervisor: the gRPC service of GitLab's
// nesting with its semantics (reference/gitlab-next.md §3.2).
//
//	            Init (hypervisor accepts)
//	uninitialized ─────────────────────────► initialized
//	      ▲   Init (refused): stays                │  Create/Delete/List
//	      │                                        │
//	      └────────────── Shutdown ────────────────┘
//
// Before Init, Create/Delete/List/Shutdown fail with ErrNotInitialized; Init
// on an initialized daemon fails with ErrAlreadyInitialized. Shutdown stops
// the hypervisor's VMs and makes the daemon uninitialized again (upstream's
// contract: the next client must Init again, which GitLab Runner does
// lazily).
//
// Slots: Create with a slot first deletes the VM recorded in that slot
// ("stomp") and reports its id, then creates and records the new VM; Creates
// for one slot run one at a time. Delete forgets every slot holding the id.
// The slot map lives in memory only: a restarted daemon knows no slots.
//
// The methods are the service in Go terms, safe for concurrent use; Serve
// puts them on the wire.
type Server struct {
	hv  Hypervisor
	log *slog.Logger

	life sync.Mutex // held across hypervisor Init and Shutdown

	mu        sync.Mutex // guards the fields below
	inited    bool
	slots     map[int32]string        // slot → VM id
	slotLocks map[int32]chan struct{} // slot → a 1-token semaphore serializing Creates
}

// NewServer returns an uninitialized daemon over hv. log may be nil.
func NewServer(hv Hypervisor, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{hv: hv, log: log, slots: map[int32]string{}, slotLocks: map[int32]chan struct{}{}}
}

// Init configures the hypervisor with config (JSON). The daemon counts as
// initialized only if the hypervisor accepted it.
func (s *Server) Init(ctx context.Context, config []byte) error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.initialized() {
		return ErrAlreadyInitialized
	}
	if err := s.hv.Init(ctx, config); err != nil {
		s.log.Warn("nesting init refused", "err", err)
		return fmt.Errorf("hypervisor refused the config: %w", err)
	}
	s.mu.Lock()
	s.inited = true
	s.mu.Unlock()
	s.log.Info("nesting initialized")
	return nil
}

// Shutdown stops every VM of the hypervisor and makes the daemon
// uninitialized. If the hypervisor fails, the daemon stays initialized.
func (s *Server) Shutdown(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if !s.initialized() {
		// Upstream answers "already initialized" here (a slip of its
		// code); the code FailedPrecondition is the contract, the message
		// is ours.
		return ErrNotInitialized
	}
	if err := s.hv.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutting down the hypervisor: %w", err)
	}
	s.mu.Lock()
	s.inited = false
	clear(s.slots) // their VMs are gone
	s.mu.Unlock()
	s.log.Info("nesting shut down")
	return nil
}

// Create makes a VM from image name. With a slot, it first deletes the VM
// recorded in that slot and returns its id as stomped ("" when the slot was
// free), then records the new VM in the slot. A VM the hypervisor no longer
// knows counts as deleted. Creates for one slot are serialized, so exactly
// one VM ends up in a slot however many race for it.
func (s *Server) Create(ctx context.Context, name string, slot *int32) (vm VirtualMachine, stomped string, err error) {
	if !s.initialized() {
		return VirtualMachine{}, "", ErrNotInitialized
	}
	if slot == nil {
		vm, err := s.hv.Create(ctx, name)
		if err != nil {
			return VirtualMachine{}, "", err
		}
		s.log.Info("vm created", "id", vm.ID, "name", vm.Name, "addr", vm.Addr)
		return vm, "", nil
	}
	release, err := s.lockSlot(ctx, *slot)
	if err != nil {
		return VirtualMachine{}, "", fmt.Errorf("waiting for slot %d: %w", *slot, err)
	}
	defer release()
	if !s.initialized() { // shut down while we waited
		return VirtualMachine{}, "", ErrNotInitialized
	}
	stomped, err = s.clearSlot(ctx, *slot)
	if err != nil {
		return VirtualMachine{}, "", fmt.Errorf("clearing slot %d: %w", *slot, err)
	}
	vm, err = s.hv.Create(ctx, name)
	if err != nil {
		return VirtualMachine{}, stomped, err
	}
	s.mu.Lock()
	s.slots[*slot] = vm.ID
	s.mu.Unlock()
	s.log.Info("vm created", "id", vm.ID, "name", vm.Name, "addr", vm.Addr, "slot", *slot, "stomped", stomped)
	return vm, stomped, nil
}

// Delete deletes the VM id and forgets every slot holding it; an unknown id
// is an error wrapping ErrNotFound (and is forgotten too).
func (s *Server) Delete(ctx context.Context, id string) error {
	if !s.initialized() {
		return ErrNotInitialized
	}
	err := s.hv.Delete(ctx, id)
	if err == nil || errors.Is(err, ErrNotFound) {
		s.forget(id)
	}
	if err != nil {
		return err
	}
	s.log.Info("vm deleted", "id", id)
	return nil
}

// List returns the hypervisor's VMs whose ID has IDPrefix.
func (s *Server) List(ctx context.Context) ([]VirtualMachine, error) {
	if !s.initialized() {
		return nil, ErrNotInitialized
	}
	vms, err := s.hv.List(ctx)
	if err != nil {
		return nil, err
	}
	out := vms[:0:0]
	for _, vm := range vms {
		if len(vm.ID) >= len(IDPrefix) && vm.ID[:len(IDPrefix)] == IDPrefix {
			out = append(out, vm)
		}
	}
	return out, nil
}

func (s *Server) initialized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inited
}

// lockSlot waits for the slot's token; release gives it back.
func (s *Server) lockSlot(ctx context.Context, slot int32) (release func(), err error) {
	s.mu.Lock()
	sem, ok := s.slotLocks[slot]
	if !ok {
		sem = make(chan struct{}, 1)
		s.slotLocks[slot] = sem
	}
	s.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// clearSlot deletes the VM recorded in slot, if any, and returns its id.
// The caller holds the slot's lock.
func (s *Server) clearSlot(ctx context.Context, slot int32) (string, error) {
	s.mu.Lock()
	id, ok := s.slots[slot]
	s.mu.Unlock()
	if !ok {
		return "", nil
	}
	// Unlike upstream, a VM the hypervisor no longer knows (deleted behind
	// our back, or lost with a crash) does not block the slot forever.
	if err := s.hv.Delete(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
		return "", err
	}
	s.forget(id)
	s.log.Info("vm stomped", "id", id, "slot", slot)
	return id, nil
}

// forget removes every slot entry holding id.
func (s *Server) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, v := range s.slots {
		if v == id {
			delete(s.slots, slot)
		}
	}
}

// ShutdownTimeout bounds the hypervisor's Shutdown when Serve returns, as
// upstream.
const ShutdownTimeout = 5 * time.Minute

// stopGrace is how long Serve lets running calls finish once ctx ends
// before it cancels them.
const stopGrace = 10 * time.Second

// Serve answers gRPC on l until ctx ends or l fails, then stops the server
// (calls still running get stopGrace to finish) and shuts the hypervisor
// down (bounded by ShutdownTimeout) whether or not it was initialized, as
// upstream does. Serve closes l. Call it once. It returns nil when ctx ended.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	gs := grpc.NewServer()
	pb.RegisterNestingServer(gs, &wireServer{s: s})
	if sn, ok := s.hv.(Snapshotter); ok {
		pb.RegisterSnapshotsServer(gs, &snapshotServer{sn: sn})
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
		defer cancel()
		s.life.Lock()
		defer s.life.Unlock()
		if err := s.hv.Shutdown(sctx); err != nil {
			s.log.Error("shutting down the hypervisor", "err", err)
		}
		s.mu.Lock()
		s.inited = false
		clear(s.slots)
		s.mu.Unlock()
	}()

	served := make(chan error, 1)
	go func() { served <- gs.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving nesting on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		gs.Stop()
		<-stopped
	}
	<-served
	return nil
}

// Listen listens on the unix socket path for Serve. It creates the missing
// parent directories with mode 0700 (upstream uses 0777: a world-writable
// directory would let any local user replace the socket, and whoever reaches
// the socket controls the VMs). A socket file left behind by a daemon that
// died is removed; a live daemon on path, or a file that is not a socket, is
// an error. The socket file is removed when the listener is closed.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listening on %s: the file exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listening on %s: a nesting daemon is already listening there", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("listening on %s: removing the stale socket: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}

// DefaultSocket is the daemon's socket path, by upstream's rules:
// $NESTING_SOCKET if set; otherwise nesting.sock in a per-user directory —
// $XDG_RUNTIME_DIR on Linux and other Unix systems, ~/Library/Application
// Support on macOS, %LOCALAPPDATA% on Windows — or in the home directory
// when that one is empty.
func DefaultSocket() string {
	home, _ := os.UserHomeDir()
	return defaultSocket(runtime.GOOS, os.Getenv, home)
}

func defaultSocket(goos string, getenv func(string) string, home string) string {
	if p := getenv("NESTING_SOCKET"); p != "" {
		return p
	}
	var dir string
	switch goos {
	case "darwin":
		dir = filepath.Join(home, "Library", "Application Support")
	case "windows":
		dir = getenv("LOCALAPPDATA")
	default:
		dir = getenv("XDG_RUNTIME_DIR")
	}
	if dir == "" {
		dir = home
	}
	return filepath.Join(dir, "nesting.sock")
}
