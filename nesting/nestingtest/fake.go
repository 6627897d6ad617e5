package nestingtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/nesting"
)

// Fake is an in-memory nesting.Hypervisor: a VM is a record. It fails on
// protocol misuse (Create, Delete or List outside Init…Shutdown) so tests of
// the daemon catch a Server that calls it out of order. Its Init accepts
// any JSON object (or an empty config) and refuses anything else.
//
// The fields configure it; set them before first use.
type Fake struct {
	// Addr gives a VM's address (default "fake:<id>").
	Addr func(id string) string
	// CreateDelay is how long Create takes (it honours ctx meanwhile).
	CreateDelay time.Duration

	mu        sync.Mutex
	inited    bool
	config    []byte
	vms       map[string]nesting.VirtualMachine
	inits     int
	shutdowns int
}

var _ nesting.Hypervisor = (*Fake)(nil)

// Init accepts an empty config or a JSON object.
func (f *Fake) Init(ctx context.Context, config []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(strings.TrimSpace(string(config))) > 0 {
		var obj map[string]any
		if err := json.Unmarshal(config, &obj); err != nil {
			return fmt.Errorf("fake hypervisor: config is not a JSON object: %w", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inited {
		return fmt.Errorf("fake hypervisor: Init twice without Shutdown")
	}
	f.inited = true
	f.config = slices.Clone(config)
	f.inits++
	return nil
}

// Create records a VM named name, after CreateDelay.
func (f *Fake) Create(ctx context.Context, name string) (nesting.VirtualMachine, error) {
	if err := f.check("Create"); err != nil {
		return nesting.VirtualMachine{}, err
	}
	if f.CreateDelay > 0 {
		t := time.NewTimer(f.CreateDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nesting.VirtualMachine{}, fmt.Errorf("fake hypervisor: creating a vm from %q: %w", name, ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return nesting.VirtualMachine{}, fmt.Errorf("fake hypervisor: creating a vm from %q: %w", name, err)
	}
	if name == "" {
		return nesting.VirtualMachine{}, fmt.Errorf("fake hypervisor: no image name")
	}
	id := nesting.NewID()
	addr := "fake:" + id
	if f.Addr != nil {
		addr = f.Addr(id)
	}
	vm := nesting.VirtualMachine{ID: id, Name: name, Addr: addr}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.inited { // shut down while creating
		return nesting.VirtualMachine{}, fmt.Errorf("fake hypervisor: shut down while creating a vm from %q", name)
	}
	if f.vms == nil {
		f.vms = map[string]nesting.VirtualMachine{}
	}
	f.vms[id] = vm
	return vm, nil
}

// Delete forgets the VM id.
func (f *Fake) Delete(ctx context.Context, id string) error {
	if err := f.check("Delete"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.vms[id]; !ok {
		return fmt.Errorf("fake hypervisor: deleting %s: %w", id, nesting.ErrNotFound)
	}
	delete(f.vms, id)
	return nil
}

// List returns the VMs, sorted by ID.
func (f *Fake) List(ctx context.Context) ([]nesting.VirtualMachine, error) {
	if err := f.check("List"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f.VMs(), nil
}

// Shutdown forgets every VM and makes the fake uninitialized.
func (f *Fake) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.vms)
	f.inited = false
	f.shutdowns++
	return nil
}

func (f *Fake) check(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.inited {
		return fmt.Errorf("fake hypervisor: %s before Init (protocol misuse by the caller)", method)
	}
	return nil
}

// VMs returns the VMs it holds, sorted by ID, whatever its state.
func (f *Fake) VMs() []nesting.VirtualMachine {
	f.mu.Lock()
	defer f.mu.Unlock()
	vms := make([]nesting.VirtualMachine, 0, len(f.vms))
	for _, vm := range f.vms {
		vms = append(vms, vm)
	}
	slices.SortFunc(vms, func(a, b nesting.VirtualMachine) int { return strings.Compare(a.ID, b.ID) })
	return vms
}

// Config returns the config of the last successful Init.
func (f *Fake) Config() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.config)
}

// Initialized reports whether Init succeeded since the last Shutdown.
func (f *Fake) Initialized() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inited
}

// Calls returns how many times Init succeeded and Shutdown was called.
func (f *Fake) Calls() (inits, shutdowns int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inits, f.shutdowns
}
