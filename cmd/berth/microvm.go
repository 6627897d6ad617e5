package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/microvm"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
)

// newMicroVMProvider is the microvm executor of one [[runners]] entry
// named name. Without nesting_host it runs its own nesting daemon in this
// process on the QEMU hypervisor; unless nesting_config sets state_dir,
// that daemon's VMs live in a directory of this entry's own under QEMU's
// default state directory, so two entries (or two runner managers) never
// take each other's VMs for an earlier daemon's leftovers.
func newMicroVMProvider(c econfig.MicroVM, name string, log *slog.Logger) (executor.Provider, error) {
	opts := microvm.Options{Config: c, Logger: log}
	if c.NestingHost == "" {
		hv, ok := hypervisors[defaultHypervisor]
		if !ok {
			return nil, fmt.Errorf("microvm: this build has no %s hypervisor", defaultHypervisor)
		}
		opts.Hypervisor = hv
		state, _ := c.NestingConfig["state_dir"].(string)
		if state == "" {
			base, err := qemu.DefaultStateDir()
			if err != nil {
				return nil, fmt.Errorf("microvm: nesting_config.state_dir: %w", err)
			}
			state = filepath.Join(base, "runner-"+executor.SafeName(name))
			cfg := maps.Clone(c.NestingConfig)
			if cfg == nil {
				cfg = map[string]any{}
			}
			cfg["state_dir"] = state
			opts.Config.NestingConfig = cfg
		}
		opts.StateDir = state
	}
	return microvm.New(opts)
}

// runMicroVM is berth run's microvm executor: its own nesting daemon on
// QEMU, with the VMs' files in a temporary directory removed at the end,
// and images converted from the Docker engine, and their VM templates,
// in the user's cache. When this machine cannot run microVMs it returns nil and why.
func runMicroVM(log *slog.Logger) (*tempMicroVM, string) {
	hv, why := runMicroVMCheck()
	if why != "" {
		return nil, why
	}
	state, err := os.MkdirTemp("", "berth-run-vm-")
	if err != nil {
		return nil, err.Error()
	}
	cfg := map[string]any{"state_dir": state}
	// The VMs go with the run; the templates their warm starts restore
	// from stay for the next run, in the user's cache.
	if cache, err := os.UserCacheDir(); err == nil {
		cfg["template_dir"] = filepath.Join(cache, "berth", "vmtemplates")
	}
	p, err := microvm.New(microvm.Options{Config: econfig.MicroVM{NestingConfig: cfg},
		Hypervisor: hv, StateDir: state, Logger: log.With("component", "microvm")})
	if err != nil {
		os.RemoveAll(state)
		return nil, err.Error()
	}
	return &tempMicroVM{Provider: p, dir: state}, ""
}

// runMicroVMCheck says why this machine cannot run microVMs of its own
// ("" when it can), and returns the hypervisor when it can.
func runMicroVMCheck() (func(*slog.Logger) nesting.Hypervisor, string) {
	if runtime.GOOS != "linux" {
		return nil, "microVMs run on Linux only"
	}
	if os.Geteuid() != 0 {
		return nil, "not root (making VM images keeps files' owners)"
	}
	for _, p := range []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4"} {
		if _, err := exec.LookPath(p); err != nil {
			return nil, p + " is not installed (Debian: apt-get install qemu-system-x86 qemu-utils e2fsprogs)"
		}
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		return nil, "no kernel in /boot (Debian: apt-get install linux-image-amd64)"
	}
	hv, ok := hypervisors[defaultHypervisor]
	if !ok {
		return nil, "this build has no " + defaultHypervisor + " hypervisor"
	}
	return hv, ""
}

// tempMicroVM is a microvm provider whose state directory goes with it.
type tempMicroVM struct {
	*microvm.Provider
	dir string
}

func (p *tempMicroVM) Shutdown(ctx context.Context) error {
	err := p.Provider.Shutdown(ctx)
	os.RemoveAll(p.dir)
	return err
}
