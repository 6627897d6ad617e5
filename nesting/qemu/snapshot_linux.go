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
// `berth debug` restores; CreateFromBundle makes a VM of a daemon from
// one, for a job that resumes it.
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
	sh := v.shape
	meta := BundleMeta{Format: BundleFormat, VM: id, Image: v.Name, Machine: sh.machine, Accel: sh.accel, CPUs: sh.cpus,
		MemoryMB: sh.memoryMB, Network: sh.network, BootID: v.bootID, MemBackend: v.memBackend,
		QEMUVersion: qemuVersion(s.qemu), Made: time.Now().UTC(), Job: job}
	if err := h.saveVM(ctx, s, v, tmp, true); err != nil {
		return fmt.Errorf("qemu: snapshot of VM %s: %w", id, err)
	}
	files := []struct{ name, path string }{
		{bundleKernel, sh.kernel}, {bundleInitramfs, sh.initrd},
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
	return readBundle(r, dir, nil)
}

// readBundle is ReadBundle, refusing the bundle as soon as its metadata
// is read when check (if not nil) fails.
func readBundle(r io.Reader, dir string, check func(BundleMeta) error) (BundleMeta, error) {
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
			if check != nil {
				if err := check(meta); err != nil {
					return meta, err
				}
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
	h := New(o.Logger)
	h.warnVersion(s, meta)
	p, info, err := h.resume(ctx, s, meta.saved(dir), meta.VM, dir, o.Timeout)
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

// saved is a VM saved by migration that a new VM resumes: its state, the
// disk it was saved with (the new VM's overlay goes on it) and the shape
// QEMU needs to load the state.
type saved struct {
	shape
	image, bootID string
	memBackend    bool
	state, disk   string
	// from says what it was saved from, as log attributes.
	from []any
}

// saved is the VM of the bundle unpacked in dir.
func (m BundleMeta) saved(dir string) saved {
	return saved{shape: shape{machine: m.Machine, accel: m.Accel, network: m.Network, cpus: m.CPUs, memoryMB: m.MemoryMB,
		kernel: filepath.Join(dir, bundleKernel), initrd: filepath.Join(dir, bundleInitramfs)},
		image: m.Image, bootID: m.BootID, memBackend: m.MemBackend,
		state: filepath.Join(dir, bundleState), disk: filepath.Join(dir, bundleDisk), from: []any{"snapshot_of", m.VM, "job", m.Job.ID}}
}

// resume starts QEMU in dir resuming sv as VM id: a qcow2 overlay on its
// disk, its state loaded, and the guest told its new name (id) by the
// agent's Restored; the kernel's command line stays the saved VM's
// (bootID). Like boot, it returns once the agent answered.
func (h *Hypervisor) resume(ctx context.Context, s *setup, sv saved, id, dir string, timeout time.Duration) (*proc, guest.Info, error) {
	spec := sv.spec(id, dir)
	spec.bootID, spec.memRAM, spec.incoming = sv.bootID, sv.memBackend, sv.state
	if err := h.overlay(ctx, s, sv.disk, "qcow2", spec.disk); err != nil {
		return nil, guest.Info{}, err
	}
	return h.boot(ctx, s, spec, timeout)
}

// resumeVM makes VM id in dir (for makeVM) resuming what load returns;
// load may fill dir. what says what it is made from, in the log.
func (h *Hypervisor) resumeVM(ctx context.Context, s *setup, id, dir, what string, load func(dir string) (saved, error)) (*vm, error) {
	began := time.Now()
	sv, err := load(dir)
	if err != nil {
		return nil, err
	}
	p, _, err := h.resume(ctx, s, sv, id, dir, s.cfg.BootTimeout)
	if err != nil {
		return nil, err
	}
	v := &vm{VirtualMachine: nesting.VirtualMachine{ID: id, Name: sv.image, Addr: "unix://" + socketPath(dir)}, dir: dir, proc: p,
		bootID: sv.bootID, memBackend: sv.memBackend, shape: sv.shape}
	go h.watch(v)
	h.log.Info("VM created "+what, append([]any{"id", id, "image", sv.image, "pid", p.pid, "addr", v.Addr,
		"took", time.Since(began).Round(time.Millisecond)}, sv.from...)...)
	return v, nil
}

var _ nesting.BundleRestorer = (*Hypervisor)(nil)

// CreateFromBundle implements nesting.BundleRestorer: the bundle is
// unpacked in the new VM's directory and resumed there as RestoreBundle
// does, in the bundle's shape with its kernel and initramfs, but as a VM
// of this daemon (listed, deleted by Delete and Shutdown) with an id and
// host name of its own. A bundle that cannot run here is refused: one
// made under KVM when this daemon runs TCG, or of another machine type.
func (h *Hypervisor) CreateFromBundle(ctx context.Context, r io.Reader) (nesting.VirtualMachine, nesting.SnapshotJob, error) {
	var meta BundleMeta
	v, err := h.makeVM(ctx, "from a snapshot bundle", func(ctx context.Context, s *setup, id, dir string) (*vm, error) {
		load := func(dir string) (saved, error) {
			var err error
			if meta, err = readBundle(ctxReader{ctx, r}, dir, func(m BundleMeta) error { return m.runsOn(s) }); err != nil {
				return saved{}, err
			}
			h.warnVersion(s, meta)
			return meta.saved(dir), nil
		}
		return h.resumeVM(ctx, s, id, dir, "from a snapshot bundle", load)
	})
	if err != nil {
		return nesting.VirtualMachine{}, nesting.SnapshotJob{}, err
	}
	return v, meta.Job, nil
}

// runsOn says why the bundle's VM cannot run on the daemon of s.
func (m BundleMeta) runsOn(s *setup) error {
	if m.Accel == AccelKVM && s.accel != AccelKVM {
		return fmt.Errorf("the snapshot of VM %s was taken under KVM and its CPU state needs KVM to restore; this daemon runs %s (%s)", m.VM, s.accel, s.accelReason)
	}
	if m.Machine != s.cfg.Machine {
		return fmt.Errorf("the snapshot of VM %s is of a %s machine; this daemon runs %s machines (machine)", m.VM, m.Machine, s.cfg.Machine)
	}
	return nil
}

// warnVersion warns when meta was made by another QEMU than s's:
// migration streams are compatible across some versions, not all, so the
// restore is tried, and the warning says why it may fail.
func (h *Hypervisor) warnVersion(s *setup, meta BundleMeta) {
	if v := qemuVersion(s.qemu); v != meta.QEMUVersion {
		h.log.Warn("restoring a snapshot made by another QEMU", "made_by", meta.QEMUVersion, "this", v)
	}
}

// ctxReader is r that fails once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := context.Cause(c.ctx); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
