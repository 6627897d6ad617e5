package qemu

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/nesting"
)

// VM snapshot bundles. SnapshotVM saves a running VM whole — its memory
// and devices through QEMU's migration (memory included), its disk
// flattened into one qcow2 file, the kernel and initramfs it runs — as a
// zstd-compressed tar stream; RestoreBundle starts a VM from one, on this
// machine or another with the same QEMU, where the guest resumes as it
// was (processes, files, page cache). A failed job's snapshot is what
// `berth debug` restores.
//
// Members, in this order: meta.json, kernel, initramfs, disk.qcow2, state.

// BundleFormat is meta.json's format.
const BundleFormat = "berth-vm-snapshot-1"

// Bundle members.
const (
	bundleMeta      = "meta.json"
	bundleKernel    = "kernel"
	bundleInitramfs = "initramfs"
	bundleDisk      = "disk.qcow2"
	bundleState     = "state"
)

// BundleMeta describes a snapshot bundle: the VM's shape (a restore must
// recreate it exactly) and what the job left for a debugger.
type BundleMeta struct {
	Format string `json:"format"`
	// VM is the snapshotted VM's id (the restored guest's host name).
	VM       string `json:"vm"`
	Image    string `json:"image"`
	Machine  string `json:"machine"`
	Accel    string `json:"accel"`
	CPUs     int    `json:"cpus"`
	MemoryMB int    `json:"memory_mb"`
	Network  string `json:"network"`
	// BootID is the host name on the kernel's command line; MemBackend
	// says the VM's memory was a memory backend named "mem" (a VM
	// restored from a template), which the restored VM must have too.
	BootID      string    `json:"boot_id"`
	MemBackend  bool      `json:"mem_backend"`
	QEMUVersion string    `json:"qemu_version"`
	Made        time.Time `json:"made"`
	Job         BundleJob `json:"job"`
}

// BundleJob is what a snapshot says of the job it was taken in.
type BundleJob = nesting.SnapshotJob

// maxMigrateBandwidth lifts QEMU's default migration rate limit (32 MiB/s)
// for a snapshot to a local file.
const maxMigrateBandwidth = int64(1) << 36

// SnapshotVM writes a bundle of VM id to w: the VM is paused while its
// memory and devices are saved and its disk is copied, then runs on (a
// job's after_script still runs in it). job is stored in the bundle's
// metadata.
func (h *Hypervisor) SnapshotVM(ctx context.Context, id string, job BundleJob, w io.Writer) error {
	h.mu.Lock()
	v, s := h.vms[id], h.setup
	h.mu.Unlock()
	if v == nil || s == nil {
		return fmt.Errorf("qemu: snapshot of VM %q: %w", id, nesting.ErrNotFound)
	}
	tmp, err := os.MkdirTemp(v.dir, "snapshot-")
	if err != nil {
		return fmt.Errorf("qemu: snapshot of VM %s: %w", id, err)
	}
	defer os.RemoveAll(tmp)
	meta := BundleMeta{Format: BundleFormat, VM: id, Image: v.Name, Machine: s.cfg.Machine, Accel: s.accel, CPUs: s.cfg.CPUs,
		MemoryMB: s.cfg.MemoryMB, Network: s.cfg.Network, BootID: v.bootID, MemBackend: v.memBackend,
		QEMUVersion: qemuVersion(s.qemu), Made: time.Now().UTC(), Job: job}
	if err := h.saveVM(ctx, s, v, tmp, true); err != nil {
		return fmt.Errorf("qemu: snapshot of VM %s: %w", id, err)
	}
	files := []struct{ name, path string }{
		{bundleKernel, s.boot.BootKernel()}, {bundleInitramfs, s.boot.Initramfs},
		{bundleDisk, filepath.Join(tmp, bundleDisk)}, {bundleState, filepath.Join(tmp, bundleState)},
	}
	if err := writeBundle(w, meta, files); err != nil {
		return fmt.Errorf("qemu: snapshot of VM %s: %w", id, err)
	}
	return nil
}

// saveVM pauses v, saves its memory and devices to dir/state and its
// disk to dir/disk.qcow2, and lets it run again. The disk is flattened
// (one file, for another machine) or, for a branch point on this one, a
// copy of the VM's overlay on the same backing file.
func (h *Hypervisor) saveVM(ctx context.Context, s *setup, v *vm, dir string, flatten bool) (err error) {
	q, err := dialQMP(ctx, filepath.Join(v.dir, qmpFile))
	if err != nil {
		return err
	}
	defer q.Close()
	if _, err := q.execute(ctx, "stop", nil); err != nil {
		return err
	}
	defer func() {
		// After a completed migration QEMU takes its disks back on cont.
		if _, cerr := q.execute(context.WithoutCancel(ctx), "cont", nil); cerr != nil && err == nil {
			err = fmt.Errorf("resuming the VM: %w", cerr)
		}
	}()
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": false}}}
	if _, err := q.execute(ctx, "migrate-set-capabilities", caps); err != nil {
		return err
	}
	if _, err := q.execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": maxMigrateBandwidth}); err != nil {
		return err
	}
	if _, err := q.execute(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(filepath.Join(dir, bundleState))}); err != nil {
		return err
	}
	if err := migrated(ctx, q, 20*time.Millisecond); err != nil {
		return fmt.Errorf("saving the VM's memory and devices: %w", err)
	}
	// The disk as the saved memory knows it: QEMU flushed and let go of
	// it when the migration completed (-U: it still has it open).
	if !flatten {
		if err := copyFile(filepath.Join(v.dir, overlayFile), filepath.Join(dir, bundleDisk)); err != nil {
			return fmt.Errorf("copying the disk: %w", err)
		}
		return nil
	}
	out, err := exec.CommandContext(ctx, s.qemuImg, "convert", "-U", "-O", "qcow2", filepath.Join(v.dir, overlayFile), filepath.Join(dir, bundleDisk)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copying the disk: %s: %w: %s", s.qemuImg, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyFile copies from to a new file to (copy_file_range: a reflink or
// an in-kernel copy where the file system can).
func copyFile(from, to string) (err error) {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(out, in)
	return err
}

// qemuVersion is the first line of `qemu --version`.
func qemuVersion(qemu string) string {
	out, err := exec.Command(qemu, "--version").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// writeBundle writes meta and the files as a zstd-compressed tar stream.
func writeBundle(w io.Writer, meta BundleMeta, files []struct{ name, path string }) error {
	zw, err := zstd.NewWriter(w)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: bundleMeta, Mode: 0o600, Size: int64(len(b)), ModTime: meta.Made, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(b); err != nil {
		return err
	}
	for _, f := range files {
		if err := addFile(tw, f.name, f.path, meta.Made); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func addFile(tw *tar.Writer, name, path string, mtime time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: fi.Size(), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// maxBundleMeta bounds meta.json.
const maxBundleMeta = 1 << 20

// ReadBundle unpacks a bundle into dir (which must exist and be empty)
// and returns its metadata. Only the bundle's own members are accepted.
func ReadBundle(r io.Reader, dir string) (BundleMeta, error) {
	var meta BundleMeta
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return meta, fmt.Errorf("snapshot bundle: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	want := []string{bundleMeta, bundleKernel, bundleInitramfs, bundleDisk, bundleState}
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if i != len(want) {
				return meta, fmt.Errorf("snapshot bundle: ends after %d of its %d members (%s missing)", i, len(want), want[i])
			}
			return meta, nil
		}
		if err != nil {
			return meta, fmt.Errorf("snapshot bundle: %w", err)
		}
		if i >= len(want) || hdr.Name != want[i] || hdr.Typeflag != tar.TypeReg {
			return meta, fmt.Errorf("snapshot bundle: unexpected member %q (type %c) at position %d", hdr.Name, hdr.Typeflag, i+1)
		}
		if hdr.Name == bundleMeta {
			if hdr.Size > maxBundleMeta {
				return meta, fmt.Errorf("snapshot bundle: meta.json of %d bytes", hdr.Size)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return meta, fmt.Errorf("snapshot bundle: meta.json: %w", err)
			}
			if err := json.Unmarshal(b, &meta); err != nil {
				return meta, fmt.Errorf("snapshot bundle: meta.json: %w", err)
			}
			if meta.Format != BundleFormat {
				return meta, fmt.Errorf("snapshot bundle: format %q, this berth reads %q", meta.Format, BundleFormat)
			}
			if err := meta.validate(); err != nil {
				return meta, fmt.Errorf("snapshot bundle: meta.json: %w", err)
			}
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, hdr.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return meta, fmt.Errorf("snapshot bundle: %w", err)
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return meta, fmt.Errorf("snapshot bundle: %s: %w", hdr.Name, err)
		}
	}
}

// validate checks what a restore puts on QEMU's command line.
func (m BundleMeta) validate() error {
	cfg := DefaultConfig()
	cfg.Machine, cfg.CPUs, cfg.MemoryMB, cfg.Network, cfg.StateDir = m.Machine, m.CPUs, m.MemoryMB, m.Network, "/"
	if m.Accel != AccelTCG && m.Accel != AccelKVM {
		return fmt.Errorf("accel %q", m.Accel)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	for _, id := range []string{m.VM, m.BootID} {
		if !strings.HasPrefix(id, nesting.IDPrefix) || strings.ContainsAny(id, " ,=/") || len(id) > 64 {
			return fmt.Errorf("VM id %q", id)
		}
	}
	return nil
}

// RestoredVM is a VM started from a bundle by RestoreBundle.
type RestoredVM struct {
	Meta BundleMeta
	// Info is what its agent said once it answered.
	Info  guest.Info
	Agent *guest.Client
	proc  *proc
	dir   string
}

// RestoreOptions configure RestoreBundle.
type RestoreOptions struct {
	// QEMU and QEMUImg are the programs (default from PATH).
	QEMU, QEMUImg string
	// Timeout bounds the restore, from QEMU's start to the agent's answer
	// (default 5m).
	Timeout time.Duration
	Logger  *slog.Logger
}

// RestoreBundle starts the VM of a bundle unpacked in dir (ReadBundle):
// a qcow2 overlay on its disk (the bundle's files stay as they are), QEMU
// loading its memory and devices, and the guest resumed where it was
// saved. Close stops it; dir is the caller's to remove.
func RestoreBundle(ctx context.Context, dir string, meta BundleMeta, o RestoreOptions) (*RestoredVM, error) {
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	if o.QEMUImg == "" {
		o.QEMUImg = "qemu-img"
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	s := &setup{}
	var err error
	if s.qemu, err = lookPath("qemu", o.QEMU, "qemu-system-x86"); err != nil {
		return nil, err
	}
	if s.qemuImg, err = lookPath("qemu_img", o.QEMUImg, "qemu-utils"); err != nil {
		return nil, err
	}
	if meta.Accel == AccelKVM {
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return nil, fmt.Errorf("the snapshot was taken under KVM and its CPU state needs KVM to restore; this machine has no /dev/kvm: %w", err)
		}
	}
	if v := qemuVersion(s.qemu); v != meta.QEMUVersion {
		// Migration streams are compatible across some versions, not
		// all: try, and say why if it fails.
		if o.Logger != nil {
			o.Logger.Warn("restoring a snapshot made by another QEMU", "made_by", meta.QEMUVersion, "this", v)
		}
	}
	h := New(o.Logger)
	overlay := filepath.Join(dir, overlayFile)
	if err := h.overlay(ctx, s, filepath.Join(dir, bundleDisk), "qcow2", overlay); err != nil {
		return nil, err
	}
	spec := vmSpec{id: meta.VM, dir: dir, machine: meta.Machine, accel: meta.Accel, cpus: meta.CPUs, memoryMB: meta.MemoryMB,
		network: meta.Network, kernel: filepath.Join(dir, bundleKernel), initrd: filepath.Join(dir, bundleInitramfs), disk: overlay,
		bootID: meta.BootID, memRAM: meta.MemBackend, qmp: filepath.Join(dir, qmpFile), incoming: filepath.Join(dir, bundleState)}
	p, info, err := h.boot(ctx, s, spec, o.Timeout)
	if err != nil {
		return nil, fmt.Errorf("restoring the snapshot of VM %s (made by %s): %w", meta.VM, meta.QEMUVersion, err)
	}
	sock := socketPath(dir)
	c, err := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		p.stop(context.WithoutCancel(ctx), deleteGrace)
		return nil, err
	}
	return &RestoredVM{Meta: meta, Info: info, Agent: c, proc: p, dir: dir}, nil
}

// Close stops the restored VM.
func (r *RestoredVM) Close() error {
	r.Agent.Close()
	return r.proc.stop(context.Background(), deleteGrace)
}
