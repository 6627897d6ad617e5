// Package guest is Berth's agent inside a VM and the host's client of it.
//
// A microVM boots Berth's kernel and initramfs (package vmimage); the
// initramfs runs the berth binary as the VM's init (`berth guest --init`,
// Init), which mounts the job's root filesystem (the job image, on the
// VM's first disk, writable through the hypervisor's copy-on-write
// overlay) at RootDir, brings the network up (QEMU's user networking:
// 10.0.2.15, the host at 10.0.2.2), makes the berth binary available in
// the root filesystem as the job's helper (HelperPath), starts the agent
// (`berth guest --serve`) and from then on only reaps orphans.
//
// The agent serves the host over the VM's virtio-serial port
// "berth.agent": one byte stream carrying gRPC (HTTP/2 multiplexes the
// calls), so no network, no SSH server and nothing in the image are
// needed to run jobs. Its calls (internal/pb/guest.proto): Hello (clock
// sync, what the guest is), Run (a script in the root filesystem, chroot,
// with streamed output, exit status and cancel), Forward (a TCP forwarder
// inside the guest), Poweroff.
//
// The VM runs one job: when a job's script ends or is canceled, every
// process of the VM but init, the agent and the kernel's threads is
// killed — also processes that left the process group, the session and
// cleared their environment. Auxiliary runs (Detached: the executor's
// own set-up and probes) are spared by that and stop only their own
// process group.
package guest

import (
	"errors"
	"time"
)

// Paths inside the VM.
const (
	// RootDir is where init mounts the job's root filesystem; scripts run
	// chrooted into it.
	RootDir = "/mnt/root"
	// HelperPath is the berth binary inside the job's root filesystem.
	HelperPath = "/usr/local/berth/berth"
	// PortName is the name of the virtio-serial port the agent serves on.
	PortName = "berth.agent"
	// HostAddr is the host as the guest sees it with QEMU's user
	// networking.
	HostAddr = "10.0.2.2"
)

// DefaultGrace is how long a canceled script gets between SIGTERM and
// SIGKILL when the host does not say.
const DefaultGrace = 10 * time.Second

// ErrCanceled is what a canceled run's failure unwraps to on the host.
var ErrCanceled = errors.New("canceled in the guest")

// ImageConfigPath is where a VM image keeps what its container image
// said of how to run it (ImageConfig, JSON), relative to the root.
const ImageConfigPath = "etc/berth/image.json"

// ImageConfig is the part of a container image's configuration a job in a
// VM made from it runs with, as `docker run` would: the environment
// (PATH of the image's tools), working directory and user.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}
