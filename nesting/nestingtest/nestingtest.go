// Package nestingtest is the conformance suite of the nesting.Hypervisor
// contract — the behaviour every hypervisor of a nesting daemon must show —
// and Fake, an in-memory hypervisor for tests of the daemon and its users.
package nestingtest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/nesting"
)

// WaitTimeout bounds every call of the suite (a VM has to boot within it).
// It is a safety net against hanging, not a performance requirement.
var WaitTimeout = 5 * time.Minute

// Option configures Run.
type Option func(*options)

type options struct {
	config []byte
}

// WithConfig sets the config the suite passes to Init (default {}).
func WithConfig(config []byte) Option {
	return func(o *options) { o.config = config }
}

// Run runs the suite. newHypervisor returns a new, uninitialized hypervisor
// with no VMs; it is called once per subtest, and the suite calls Shutdown
// at the end of each. image is an image name Create accepts. A subtest runs
// at most 2 VMs at once.
func Run(t *testing.T, newHypervisor func(t *testing.T) nesting.Hypervisor, image string, opts ...Option) {
	o := options{config: []byte("{}")}
	for _, opt := range opts {
		opt(&o)
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, s *subject)
	}{
		{"InitAcceptsConfig", testInit},
		{"CreateReturnsPrefixedIDAndAddr", testCreate},
		{"ListShowsCreated", testList},
		{"DeleteRemoves", testDelete},
		{"DeleteUnknownIsNotFound", testDeleteUnknown},
		{"DeleteTwiceIsNotFound", testDeleteTwice},
		{"ConcurrentCreates", testConcurrentCreates},
		{"CreateWithCancelledContext", testCreateCancelled},
		{"ShutdownLeavesNothing", testShutdown},
		{"ShutdownBeforeInit", testShutdownBeforeInit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &subject{hv: newHypervisor(t), image: image, config: o.config}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
				defer cancel()
				if err := s.hv.Shutdown(ctx); err != nil {
					t.Errorf("Shutdown at the end: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

type subject struct {
	hv     nesting.Hypervisor
	image  string
	config []byte
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	t.Cleanup(cancel)
	return c
}

func (s *subject) init(t *testing.T) {
	t.Helper()
	if err := s.hv.Init(ctx(t), s.config); err != nil {
		t.Fatalf("Init(%s): %v", s.config, err)
	}
}

func (s *subject) create(t *testing.T) nesting.VirtualMachine {
	t.Helper()
	vm, err := s.hv.Create(ctx(t), s.image)
	if err != nil {
		t.Fatalf("Create(%q): %v", s.image, err)
	}
	return vm
}

func (s *subject) list(t *testing.T) []nesting.VirtualMachine {
	t.Helper()
	vms, err := s.hv.List(ctx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, vm := range vms {
		if !nesting.ValidID(vm.ID) {
			t.Errorf("List returned %+v: its ID does not have the %q prefix and 8 chars of [a-z0-9]", vm, nesting.IDPrefix)
		}
	}
	return vms
}

func ids(vms []nesting.VirtualMachine) []string {
	out := make([]string, 0, len(vms))
	for _, vm := range vms {
		out = append(out, vm.ID)
	}
	slices.Sort(out)
	return out
}

func testInit(t *testing.T, s *subject) {
	s.init(t)
	if vms := s.list(t); len(vms) != 0 {
		t.Errorf("a new hypervisor lists %v, want no VMs", ids(vms))
	}
}

func testCreate(t *testing.T, s *subject) {
	s.init(t)
	vm := s.create(t)
	if !nesting.ValidID(vm.ID) {
		t.Errorf("Create returned ID %q, want %q followed by 8 chars of [a-z0-9]", vm.ID, nesting.IDPrefix)
	}
	if vm.Name != s.image {
		t.Errorf("Create returned Name %q, want the image name %q", vm.Name, s.image)
	}
	if vm.Addr == "" {
		t.Error("Create returned an empty Addr")
	}
}

func testList(t *testing.T, s *subject) {
	s.init(t)
	vm := s.create(t)
	vms := s.list(t)
	i := slices.IndexFunc(vms, func(v nesting.VirtualMachine) bool { return v.ID == vm.ID })
	if i < 0 {
		t.Fatalf("List = %v, want it to hold the created %s", ids(vms), vm.ID)
	}
	if vms[i] != vm {
		t.Errorf("List shows %+v, Create returned %+v", vms[i], vm)
	}
	if len(vms) != 1 {
		t.Errorf("List = %v, want only %s", ids(vms), vm.ID)
	}
}

func testDelete(t *testing.T, s *subject) {
	s.init(t)
	vm := s.create(t)
	if err := s.hv.Delete(ctx(t), vm.ID); err != nil {
		t.Fatalf("Delete(%s): %v", vm.ID, err)
	}
	if vms := s.list(t); slices.Contains(ids(vms), vm.ID) {
		t.Errorf("List after Delete(%s) = %v", vm.ID, ids(vms))
	}
}

func testDeleteUnknown(t *testing.T, s *subject) {
	s.init(t)
	for _, id := range []string{nesting.NewID(), "not-a-nesting-id"} {
		if err := s.hv.Delete(ctx(t), id); !errors.Is(err, nesting.ErrNotFound) {
			t.Errorf("Delete(%q) of an unknown id = %v, want an error wrapping nesting.ErrNotFound", id, err)
		}
	}
}

func testDeleteTwice(t *testing.T, s *subject) {
	s.init(t)
	vm := s.create(t)
	if err := s.hv.Delete(ctx(t), vm.ID); err != nil {
		t.Fatalf("Delete(%s): %v", vm.ID, err)
	}
	if err := s.hv.Delete(ctx(t), vm.ID); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("second Delete(%s) = %v, want an error wrapping nesting.ErrNotFound", vm.ID, err)
	}
}

func testConcurrentCreates(t *testing.T, s *subject) {
	s.init(t)
	const n = 2
	var (
		wg   sync.WaitGroup
		vms  [n]nesting.VirtualMachine
		errs [n]error
	)
	for i := range n {
		wg.Go(func() { vms[i], errs[i] = s.hv.Create(ctx(t), s.image) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Create %d: %v", i, err)
		}
	}
	if vms[0].ID == vms[1].ID {
		t.Fatalf("two Creates returned the same ID %s", vms[0].ID)
	}
	if got, want := ids(s.list(t)), ids(vms[:]); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}

func testCreateCancelled(t *testing.T, s *subject) {
	s.init(t)
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	vm, err := s.hv.Create(c, s.image)
	if err == nil {
		t.Errorf("Create with a cancelled context returned %+v and no error", vm)
	}
	if vms := s.list(t); len(vms) != 0 {
		t.Errorf("after a cancelled Create, List = %v, want no VMs", ids(vms))
	}
}

func testShutdown(t *testing.T, s *subject) {
	s.init(t)
	s.create(t)
	s.create(t)
	if err := s.hv.Shutdown(ctx(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := s.hv.Shutdown(ctx(t)); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	// The daemon initializes a hypervisor again after Shutdown.
	s.init(t)
	if vms := s.list(t); len(vms) != 0 {
		t.Errorf("after Shutdown and Init, List = %v, want no VMs", ids(vms))
	}
}

func testShutdownBeforeInit(t *testing.T, s *subject) {
	if err := s.hv.Shutdown(ctx(t)); err != nil {
		t.Fatalf("Shutdown before Init: %v", err)
	}
	s.init(t)
	if vms := s.list(t); len(vms) != 0 {
		t.Errorf("List = %v, want no VMs", ids(vms))
	}
}
