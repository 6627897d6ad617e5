package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// probeTimeout bounds the KVM probe: a guest that works under KVM answers
// in a second or two; a nested KVM that hangs never does.
const probeTimeout = 20 * time.Second

// accelChoice is the accelerator chosen for "auto", as cached in
// <image_dir>/accel/<key>.json.
type accelChoice struct {
	Accel  string    `json:"accel"`
	Reason string    `json:"reason"`
	Probed time.Time `json:"probed"`
	// Inputs are what the key was made of, for whoever reads the file.
	Inputs string `json:"inputs"`
}

// chooseAccel resolves s.cfg.Accel into AccelKVM or AccelTCG, saying why.
// "auto" takes TCG when /dev/kvm cannot be opened; otherwise it boots a
// probe VM under KVM (kernel and initramfs, no disk) and takes KVM if its
// agent answers within probeTimeout, TCG if not. /dev/kvm can be there
// and still not run guests (nested virtualization that hangs, a QEMU that
// cannot set the host CPU's MSRs), so only booting tells. The result is
// cached under the image directory's accel/ (a cache every daemon and
// `berth run` of the user shares), keyed by the QEMU binary, the host and
// guest kernels and the machine, so a daemon probes once per setup.
func (h *Hypervisor) chooseAccel(ctx context.Context, s *setup) (accel, reason string, err error) {
	switch s.cfg.Accel {
	case AccelTCG:
		return AccelTCG, "configured", nil
	case AccelKVM:
		if err := kvmUsable(h.kvmDevice); err != nil {
			return "", "", fmt.Errorf("accel %q: %w", AccelKVM, err)
		}
		return AccelKVM, "configured", nil
	}
	if err := kvmUsable(h.kvmDevice); err != nil {
		return AccelTCG, "no usable KVM: " + err.Error(), nil
	}
	inputs, err := accelInputs(s)
	if err != nil {
		return "", "", fmt.Errorf("accel %q: %w", AccelAuto, err)
	}
	sum := sha256.Sum256([]byte(inputs))
	cache := filepath.Join(s.accelCache, hex.EncodeToString(sum[:8])+".json")
	if b, err := os.ReadFile(cache); err == nil {
		var c accelChoice
		if json.Unmarshal(b, &c) == nil && (c.Accel == AccelKVM || c.Accel == AccelTCG) && c.Inputs == inputs {
			return c.Accel, fmt.Sprintf("%s (probed %s, cached in %s)", c.Reason, c.Probed.Format(time.RFC3339), cache), nil
		}
	}
	h.log.Info("probing KVM: booting a VM under KVM", "timeout", probeTimeout)
	start := time.Now()
	perr := h.probe(ctx, s)
	if err := ctx.Err(); err != nil {
		return "", "", fmt.Errorf("accel %q: probing KVM: %w", AccelAuto, err)
	}
	c := accelChoice{Accel: AccelKVM, Probed: time.Now(), Inputs: inputs,
		Reason: fmt.Sprintf("a probe VM booted under KVM in %v", time.Since(start).Round(time.Millisecond))}
	if perr != nil {
		c.Accel = AccelTCG
		c.Reason = "a probe VM did not boot under KVM: " + summary(perr)
		h.log.Debug("the KVM probe failed", "err", perr)
	}
	if err := writeAccelCache(cache, c); err != nil {
		h.log.Warn("caching the accelerator choice", "path", cache, "err", err)
	}
	return c.Accel, c.Reason, nil
}

// kvmUsable checks that dev (/dev/kvm) can be opened read-write.
func kvmUsable(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	unix.Close(fd)
	return nil
}

// accelInputs is what decides whether KVM works: the QEMU binary (path,
// size, modification time), the host's kernel (KVM is in it), the guest
// kernel and the machine.
func accelInputs(s *setup) (string, error) {
	fi, err := os.Stat(s.qemu)
	if err != nil {
		return "", err
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return fmt.Sprintf("qemu %s %d %d\nhost %s\nguest %s\nmachine %s\n", s.qemu, fi.Size(), fi.ModTime().UnixNano(),
		unix.ByteSliceToString(u.Release[:]), s.boot.KernelVersion, s.cfg.Machine), nil
}

func writeAccelCache(p string, c accelChoice) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// probeKVM boots a VM without disk or network under KVM and waits for its
// agent's Hello, at most probeTimeout; it removes everything it made.
func (h *Hypervisor) probeKVM(ctx context.Context, s *setup) error {
	id := "probe-" + randomSuffix()
	dir := vmDir(s.cfg.StateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec := vmSpec{id: id, dir: dir, machine: s.cfg.Machine, accel: AccelKVM, cpus: s.cfg.CPUs,
		memoryMB: min(s.cfg.MemoryMB, 256), network: NetworkNone, kernel: s.boot.BootKernel(), initrd: s.boot.Initramfs}
	p, _, err := h.boot(ctx, s, spec, probeTimeout)
	if err != nil {
		return err
	}
	return p.stop(context.WithoutCancel(ctx), deleteGrace)
}

// summary is the first line of an error, with the first line of QEMU's
// output when it is a boot error.
func summary(err error) string {
	first, _, _ := strings.Cut(err.Error(), "\n")
	var be *bootError
	if errors.As(err, &be) {
		for _, l := range strings.Split(be.stderr, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				return first + ": " + l
			}
		}
	}
	return first
}
