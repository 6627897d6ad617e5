package qemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Machines, accelerators and networks of Config.
const (
	MachineMicroVM = "microvm" // QEMU's minimal machine: virtio-mmio devices, no PCI, no firmware
	MachineQ35     = "q35"     // a full PC (firmware, PCI): virtio-pci devices

	AccelAuto = "auto" // KVM when a probe VM boots under it, else TCG
	AccelKVM  = "kvm"
	AccelTCG  = "tcg" // QEMU's emulator: slower, works everywhere

	NetworkUser = "user" // QEMU user-mode networking: 10.0.2.15/24, gateway 10.0.2.2, DNS 10.0.2.3
	NetworkNone = "none" // no NIC at all
)

// Config is the QEMU hypervisor's configuration: the JSON object of the
// nesting Init call (GitLab Runner's nesting_config table), parsed by
// ParseConfig. The JSON keys are in the field comments.
type Config struct {
	// Machine is "microvm" (default) or "q35".
	Machine string // machine
	// CPUs (default 1) and MemoryMB (default 1024; at least 128: the
	// initramfs alone unpacks to ~50 MiB) size each VM.
	CPUs     int // cpus
	MemoryMB int // memory_mb
	// Accel is "auto" (default: KVM if a probe VM boots under it, else
	// TCG; the result is cached in ImageDir/accel), "kvm" or "tcg".
	Accel string // accel
	// Network is "user" (default: QEMU user-mode networking) or "none".
	Network string // network
	// StateDir holds the VMs' files (StateDir/vms/<id>/) and the KVM
	// probe's cache. Default: /var/lib/berth/nesting for root, else
	// $XDG_STATE_HOME/berth/nesting (~/.local/state/berth/nesting).
	StateDir string // state_dir
	// ImageDir is the vmimage.Store directory of root filesystems and
	// initramfs files; default vmimage's (~/.cache/berth/vmimages).
	ImageDir string // image_dir
	// Kernel is the guest kernel; default the newest /boot/vmlinuz-*.
	Kernel string // kernel
	// BuildMissing (default true) builds an image that is not in the
	// store from the local Docker engine (a build of the same digest is a
	// cache hit); false only looks it up in the store.
	BuildMissing bool // build_missing
	// BootTimeout bounds a VM's boot, from QEMU's start to the guest
	// agent's answer (default 5m; JSON: a Go duration string).
	BootTimeout time.Duration // boot_timeout
	// Agent is the berth binary the guest runs as its init and agent
	// (it goes into the initramfs); default the berth binary of the
	// running daemon. Set it when the daemon is not a berth binary that
	// can run in the guest (an embedding program, a test).
	Agent string // agent
	// WarmStart (default true) restores VMs from a snapshot of a VM of
	// the same image taken once its agent answered, instead of booting
	// them: a template per image, made at the image's first VM. False
	// boots every VM.
	WarmStart bool // warm_start
	// WarmTemplates bounds the templates kept (default 8): the least
	// recently used goes first.
	WarmTemplates int // warm_templates
	// WarmImages are images whose templates are made as soon as the
	// hypervisor is initialized, one after the other in the background,
	// so even their first VM is restored.
	WarmImages []string // warm_images
	// TemplateDir holds the templates (default StateDir/templates). Daemons
	// with state directories of their own may share one (berth run's
	// temporary daemons share the user's).
	TemplateDir string // template_dir
	// MaxBranches bounds the branch points kept at once (default 4; 0
	// turns branching off): each holds a VM's memory and disk writes
	// (Branch, CreateFromBranch).
	MaxBranches int // max_branches
	// QEMU and QEMUImg are the programs (default qemu-system-x86_64 and
	// qemu-img, from PATH).
	QEMU    string // qemu
	QEMUImg string // qemu_img
}

// minMemoryMB is the least memory a VM gets: the kernel unpacks the
// initramfs (the berth binary and busybox, ~50 MiB) into memory.
const minMemoryMB = 128

// DefaultConfig returns the configuration of an empty JSON object.
func DefaultConfig() Config {
	return Config{
		Machine:       MachineMicroVM,
		CPUs:          1,
		MemoryMB:      1024,
		Accel:         AccelAuto,
		Network:       NetworkUser,
		BuildMissing:  true,
		BootTimeout:   5 * time.Minute,
		WarmStart:     true,
		WarmTemplates: 8,
		MaxBranches:   4,
		QEMU:          "qemu-system-x86_64",
		QEMUImg:       "qemu-img",
	}
}

// configKeys are the JSON keys of Config, each with how it is set. A
// JSON null leaves the default.
var configKeys = map[string]func(c *Config, raw json.RawMessage) error{
	"machine":        stringKey(func(c *Config) *string { return &c.Machine }),
	"cpus":           intKey(func(c *Config) *int { return &c.CPUs }),
	"memory_mb":      intKey(func(c *Config) *int { return &c.MemoryMB }),
	"accel":          stringKey(func(c *Config) *string { return &c.Accel }),
	"network":        stringKey(func(c *Config) *string { return &c.Network }),
	"state_dir":      stringKey(func(c *Config) *string { return &c.StateDir }),
	"image_dir":      stringKey(func(c *Config) *string { return &c.ImageDir }),
	"kernel":         stringKey(func(c *Config) *string { return &c.Kernel }),
	"agent":          stringKey(func(c *Config) *string { return &c.Agent }),
	"qemu":           stringKey(func(c *Config) *string { return &c.QEMU }),
	"qemu_img":       stringKey(func(c *Config) *string { return &c.QEMUImg }),
	"build_missing":  boolKey(func(c *Config) *bool { return &c.BuildMissing }),
	"warm_start":     boolKey(func(c *Config) *bool { return &c.WarmStart }),
	"warm_templates": intKey(func(c *Config) *int { return &c.WarmTemplates }),
	"template_dir":   stringKey(func(c *Config) *string { return &c.TemplateDir }),
	"max_branches":   intKey(func(c *Config) *int { return &c.MaxBranches }),
	"warm_images": func(c *Config, raw json.RawMessage) error {
		if err := json.Unmarshal(raw, &c.WarmImages); err != nil {
			return fmt.Errorf("want a list of image names, got %s", raw)
		}
		return nil
	},
	"boot_timeout": func(c *Config, raw json.RawMessage) error {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("want a duration string such as \"5m\", got %s", raw)
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as \"5m\" or \"90s\": %w", err)
		}
		c.BootTimeout = d
		return nil
	},
}

func stringKey(field func(*Config) *string) func(*Config, json.RawMessage) error {
	return func(c *Config, raw json.RawMessage) error {
		if err := json.Unmarshal(raw, field(c)); err != nil {
			return fmt.Errorf("want a string, got %s", raw)
		}
		return nil
	}
}

func intKey(field func(*Config) *int) func(*Config, json.RawMessage) error {
	return func(c *Config, raw json.RawMessage) error {
		if err := json.Unmarshal(raw, field(c)); err != nil {
			return fmt.Errorf("want an integer, got %s", raw)
		}
		return nil
	}
}

func boolKey(field func(*Config) *bool) func(*Config, json.RawMessage) error {
	return func(c *Config, raw json.RawMessage) error {
		if err := json.Unmarshal(raw, field(c)); err != nil {
			return fmt.Errorf("want true or false, got %s", raw)
		}
		return nil
	}
}

// ParseConfig reads the JSON config of Init: an object with the keys of
// Config (an empty config is {}); the keys it does not set keep
// DefaultConfig's values. An unknown key, a value of the wrong type or an
// invalid value (Validate) is an error naming the key. StateDir left
// empty is filled in with its default.
func ParseConfig(b []byte) (Config, error) {
	c := DefaultConfig()
	if len(bytes.TrimSpace(b)) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
			if err == nil {
				err = errors.New("null")
			}
			return Config{}, fmt.Errorf("qemu config: want a JSON object: %w", err)
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			set, ok := configKeys[k]
			if !ok {
				return Config{}, fmt.Errorf("qemu config: unknown key %q (known: %s)", k, strings.Join(slices.Sorted(maps.Keys(configKeys)), ", "))
			}
			if string(bytes.TrimSpace(obj[k])) == "null" {
				continue
			}
			if err := set(&c, obj[k]); err != nil {
				return Config{}, fmt.Errorf("qemu config: %s: %w", k, err)
			}
		}
	}
	if c.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return Config{}, fmt.Errorf("qemu config: state_dir: %w", err)
		}
		c.StateDir = d
	}
	if c.TemplateDir == "" {
		c.TemplateDir = filepath.Join(c.StateDir, templatesDir)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks the values, naming the JSON key of a wrong one.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("qemu config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	switch c.Machine {
	case MachineMicroVM, MachineQ35:
	default:
		return bad("machine", "%q: want %q or %q", c.Machine, MachineMicroVM, MachineQ35)
	}
	if c.CPUs < 1 || c.CPUs > 255 {
		return bad("cpus", "%d: want 1 to 255", c.CPUs)
	}
	if c.MemoryMB < minMemoryMB || c.MemoryMB > 1<<20 {
		return bad("memory_mb", "%d: want %d (the initramfs is unpacked in memory) to %d", c.MemoryMB, minMemoryMB, 1<<20)
	}
	switch c.Accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return bad("accel", "%q: want %q, %q or %q", c.Accel, AccelAuto, AccelKVM, AccelTCG)
	}
	switch c.Network {
	case NetworkUser, NetworkNone:
	default:
		return bad("network", "%q: want %q or %q", c.Network, NetworkUser, NetworkNone)
	}
	if c.StateDir == "" {
		return bad("state_dir", "empty")
	}
	if strings.Contains(c.StateDir, ",") {
		// QEMU's option syntax reads a comma as the end of a path.
		return bad("state_dir", "%q has a comma, which QEMU's -drive and -chardev options cannot take in a path", c.StateDir)
	}
	if c.BootTimeout <= 0 {
		return bad("boot_timeout", "%v: want a positive duration", c.BootTimeout)
	}
	if c.TemplateDir != "" && strings.Contains(c.TemplateDir, ",") {
		return bad("template_dir", "%q has a comma, which QEMU's options cannot take in a path", c.TemplateDir)
	}
	for i, img := range c.WarmImages {
		if strings.TrimSpace(img) == "" {
			return bad("warm_images", "entry %d is empty", i+1)
		}
	}
	if c.WarmTemplates < 1 || c.WarmTemplates > 1000 {
		return bad("warm_templates", "%d: want 1 to 1000", c.WarmTemplates)
	}
	if c.MaxBranches < 0 || c.MaxBranches > 100 {
		return bad("max_branches", "%d: want 0 (no branching) to 100", c.MaxBranches)
	}
	if c.QEMU == "" {
		return bad("qemu", "empty")
	}
	if c.QEMUImg == "" {
		return bad("qemu_img", "empty")
	}
	// A VM's agent socket is StateDir/vms/<id>/agent.sock; unix socket
	// paths are limited (108 bytes on Linux, with the final NUL).
	if abs, err := filepath.Abs(c.StateDir); err == nil {
		if n := len(socketPath(vmDir(abs, idForLength))); n >= maxSocketPath {
			return bad("state_dir", "%s is too long: the VMs' agent sockets under it would have %d-byte paths, and unix sockets allow %d", abs, n, maxSocketPath-1)
		}
	}
	return nil
}

// maxSocketPath is the size of sockaddr_un's sun_path on Linux.
const maxSocketPath = 108

// idForLength has the length of every VM ID (and of the probe's).
const idForLength = "nesting-xxxxxxxx"

// DefaultStateDir is the state_dir of an empty config: /var/lib/berth/nesting for root, else
// $XDG_STATE_HOME/berth/nesting or ~/.local/state/berth/nesting.
func DefaultStateDir() (string, error) {
	if os.Geteuid() == 0 {
		return "/var/lib/berth/nesting", nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "berth", "nesting"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no default (no home directory; set state_dir): %w", err)
	}
	return filepath.Join(home, ".local", "state", "berth", "nesting"), nil
}

// The files of a VM in its directory, StateDir/vms/<id>/.
const (
	overlayFile = "overlay.qcow2" // copy-on-write overlay of the image's root filesystem
	socketFile  = "agent.sock"    // the agent, for any number of clients (the VM's Addr; the daemon serves it)
	portFile    = "port.sock"     // the agent's virtio-serial port, QEMU listening for the daemon alone
	consoleFile = "console.log"   // the serial console (ttyS0)
	pidFile     = "qemu.pid"
	qemuLogFile = "qemu.log" // QEMU's stdout and stderr
	qmpFile     = "qmp.sock" // a template's VM: QEMU's monitor
	memFile     = "ram"      // a template's VM: its memory
)

func vmDir(stateDir, id string) string { return filepath.Join(stateDir, "vms", id) }
func socketPath(dir string) string     { return filepath.Join(dir, socketFile) }
func portPath(dir string) string       { return filepath.Join(dir, portFile) }
