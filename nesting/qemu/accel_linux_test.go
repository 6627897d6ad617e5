package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/vmimage"
)

// TestChooseAccel checks the accelerator choice with a stand-in /dev/kvm
// and a scripted probe: configured accelerators are taken as they are
// (kvm only if the device opens), "auto" takes TCG without a usable
// device, probes otherwise, and caches the probe's answer.
func TestChooseAccel(t *testing.T) {
	tmp := t.TempDir()
	kvm := filepath.Join(tmp, "kvm")
	os.WriteFile(kvm, nil, 0o600)
	newSetup := func(accel string) *setup {
		cfg := DefaultConfig()
		cfg.Accel = accel
		cfg.StateDir = filepath.Join(tmp, "state-"+accel)
		return &setup{cfg: cfg, qemu: os.Args[0], boot: &vmimage.Boot{KernelVersion: "6.1.0-test"}, accelCache: filepath.Join(cfg.StateDir, "accel")}
	}
	ctx := context.Background()
	var probes int
	var probeErr error
	h := New(testLogger(t))
	h.probe = func(ctx context.Context, s *setup) error {
		probes++
		return probeErr
	}

	h.kvmDevice = filepath.Join(tmp, "missing")
	if a, why, err := h.chooseAccel(ctx, newSetup(AccelTCG)); a != AccelTCG || why != "configured" || err != nil {
		t.Errorf("tcg: %s %q %v", a, why, err)
	}
	if _, _, err := h.chooseAccel(ctx, newSetup(AccelKVM)); err == nil || !strings.Contains(err.Error(), `accel "kvm": `+h.kvmDevice) {
		t.Errorf("kvm without the device: %v, want an error naming it", err)
	}
	if a, why, err := h.chooseAccel(ctx, newSetup(AccelAuto)); a != AccelTCG || !strings.HasPrefix(why, "no usable KVM: "+h.kvmDevice) || err != nil {
		t.Errorf("auto without the device: %s %q %v", a, why, err)
	}
	if probes != 0 {
		t.Errorf("%d probes without a usable /dev/kvm", probes)
	}

	h.kvmDevice = kvm
	if a, _, err := h.chooseAccel(ctx, newSetup(AccelKVM)); a != AccelKVM || err != nil {
		t.Errorf("kvm: %s %v", a, err)
	}
	auto := newSetup(AccelAuto)
	a, why, err := h.chooseAccel(ctx, auto)
	if a != AccelKVM || !strings.HasPrefix(why, "a probe VM booted under KVM") || err != nil || probes != 1 {
		t.Errorf("auto, probe succeeds: %s %q %v (%d probes)", a, why, err, probes)
	}
	a, why, err = h.chooseAccel(ctx, auto)
	if a != AccelKVM || !strings.Contains(why, "cached in "+filepath.Join(auto.cfg.StateDir, "accel")) || err != nil || probes != 1 {
		t.Errorf("auto again: %s %q %v (%d probes), want the cached answer", a, why, err, probes)
	}
	// Another guest kernel is another question.
	auto.boot = &vmimage.Boot{KernelVersion: "6.2.0-test"}
	probeErr = &bootError{cause: errQEMUExited{errors.New("signal: aborted")}, stderr: "qemu: error: failed to set MSR 0x10a\nmore"}
	a, why, err = h.chooseAccel(ctx, auto)
	if a != AccelTCG || err != nil || probes != 2 ||
		why != "a probe VM did not boot under KVM: QEMU exited (signal: aborted) before the guest agent answered: qemu: error: failed to set MSR 0x10a" {
		t.Errorf("auto, probe fails: %s %q %v (%d probes)", a, why, err, probes)
	}
	if a, why, _ := h.chooseAccel(ctx, auto); a != AccelTCG || !strings.Contains(why, "cached") || probes != 2 {
		t.Errorf("auto again after a failed probe: %s %q (%d probes), want the cached answer", a, why, probes)
	}
	if ents, _ := os.ReadDir(filepath.Join(auto.cfg.StateDir, "accel")); len(ents) != 2 {
		t.Errorf("accel cache holds %v, want one file per kernel", ents)
	}

	// A probe cut short by ctx decides nothing and caches nothing.
	cctx, cancel := context.WithCancel(ctx)
	h.probe = func(ctx context.Context, s *setup) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}
	fresh := newSetup(AccelAuto)
	fresh.cfg.StateDir = filepath.Join(tmp, "fresh")
	fresh.accelCache = filepath.Join(fresh.cfg.StateDir, "accel")
	if _, _, err := h.chooseAccel(cctx, fresh); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled probe: %v, want context.Canceled", err)
	}
	if _, err := os.Stat(filepath.Join(fresh.cfg.StateDir, "accel")); err == nil {
		t.Error("a canceled probe was cached")
	}
}
