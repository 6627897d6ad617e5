//go:build !linux

package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/berthci/berth/nesting"
)

// Hypervisor is the QEMU nesting.Hypervisor. It runs VMs on Linux only;
// elsewhere Init refuses every config.
type Hypervisor struct{}

var _ nesting.Hypervisor = (*Hypervisor)(nil)

// errLinuxOnly is Init's answer outside Linux.
var errLinuxOnly = errors.New("qemu: the QEMU hypervisor runs on Linux only")

// New returns a hypervisor whose Init fails: not on Linux.
func New(*slog.Logger) *Hypervisor { return &Hypervisor{} }

// Init checks the config, then refuses: not on Linux.
func (h *Hypervisor) Init(_ context.Context, config []byte) error {
	if _, err := ParseConfig(config); err != nil {
		return err
	}
	return errLinuxOnly
}

// Create fails: never initialized.
func (h *Hypervisor) Create(_ context.Context, name string) (nesting.VirtualMachine, error) {
	return nesting.VirtualMachine{}, fmt.Errorf("qemu: creating a VM of %q: %w", name, nesting.ErrNotInitialized)
}

// Delete fails: there are no VMs.
func (h *Hypervisor) Delete(_ context.Context, id string) error {
	return fmt.Errorf("qemu: deleting VM %q: %w", id, nesting.ErrNotFound)
}

// List returns nothing.
func (h *Hypervisor) List(context.Context) ([]nesting.VirtualMachine, error) { return nil, nil }

// Shutdown has nothing to stop.
func (h *Hypervisor) Shutdown(context.Context) error { return nil }

// Accel is "": never initialized.
func (h *Hypervisor) Accel() (accel, reason string) { return "", "" }

// PID finds nothing: there are no VMs.
func (h *Hypervisor) PID(string) (int, bool) { return 0, false }
