package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/vmimage"
)

// Warm starts. The first VM of an image (for one configuration) is a
// template: booted as usual, but with its memory in a file QEMU shares
// (memory-backend-file, share=on). Once its agent answered, the host lets
// go of the agent's port, waits until the agent opened the port again
// (the guest then only waits for the next host), pauses the VM and saves
// its device state with QEMU's migration (x-ignore-shared: the memory is
// already in the file). The template's files are then frozen in
// template_dir/<key>/ (default StateDir/templates):
//
//	disk.qcow2  the root disk's overlay, the backing file of every restored VM's
//	ram         the guest's memory
//	state       the devices' state (CPU, virtio queues, clocks), a few hundred KiB
//	meta.json   what it was made of
//
// A VM is then a new qcow2 overlay on disk.qcow2 and a QEMU started with
// -incoming from state, its memory a private (copy-on-write) mapping of
// ram: nothing is read until the guest touches it, and the page cache
// holds one copy for every VM of the template. The agent, told by
// Restored, takes the VM's host name, the host's clock and fresh entropy.
//
// The key covers everything the snapshot depends on: the image's digest
// and file, the kernel, initramfs (hence the agent) and QEMU binaries,
// and the machine's shape. Anything else makes another template; the one
// it replaces (same image name) is removed, and at most WarmTemplates are
// kept.

// templatesDir holds the templates under the state directory by default.
const templatesDir = "templates"

// templateFormat is the layout version, part of every key.
const templateFormat = "berth-qemu-template-1"

// Files of a template.
const (
	templateDisk  = "disk.qcow2"
	templateRAM   = "ram"
	templateState = "state"
	templateMeta  = "meta.json"
)

// templateMetadata is meta.json.
type templateMetadata struct {
	Format string    `json:"format"`
	Key    string    `json:"key"`
	Image  string    `json:"image"`
	Digest string    `json:"digest"`
	BootID string    `json:"boot_id"` // the template VM's id, on the kernel's command line
	Made   time.Time `json:"made"`
	// BootSeconds is how long the template's VM took to boot.
	BootSeconds float64 `json:"boot_seconds"`
}

// template is a usable template.
type template struct {
	dir  string
	meta templateMetadata
}

func (t *template) disk() string  { return filepath.Join(t.dir, templateDisk) }
func (t *template) ram() string   { return filepath.Join(t.dir, templateRAM) }
func (t *template) state() string { return filepath.Join(t.dir, templateState) }

// templateFailRetry is how long a template that could not be made is not
// tried again for its key (VMs boot cold meanwhile).
const templateFailRetry = 10 * time.Minute

// templateKey is the key of the template of img under setup s.
func templateKey(s *setup, img *vmimage.Image) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nimage %s %s %s\n", templateFormat, img.Digest, img.Path, fileStamp(img.Path))
	for _, f := range []string{s.boot.BootKernel(), s.boot.Initramfs, s.qemu} {
		stamp := fileStamp(f)
		if filepath.Dir(f) == filepath.Dir(s.boot.Initramfs) {
			// The image store's boot files are named by their content's
			// hash, and their modification time marks their last use
			// (every daemon's Init touches them): the name and the size
			// are their identity.
			stamp = sizeStamp(f)
		}
		fmt.Fprintf(h, "file %s %s\n", f, stamp)
	}
	fmt.Fprintf(h, "machine %s accel %s cpus %d memory %d network %s\n", s.cfg.Machine, s.accel, s.cfg.CPUs, s.cfg.MemoryMB, s.cfg.Network)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// sizeStamp is a content-addressed file's size.
func sizeStamp(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return "missing"
	}
	return fmt.Sprint(fi.Size())
}

// fileStamp identifies a file's version by size and modification time.
func fileStamp(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d@%d", fi.Size(), fi.ModTime().UnixNano())
}

// warmTemplate returns the template of img, making it when there is
// none; one Create makes it while the others of the same key wait. It
// returns nil without an error when warm starts are off, or the key's
// last attempt failed recently.
func (h *Hypervisor) warmTemplate(ctx context.Context, s *setup, img *vmimage.Image, name string) (*template, error) {
	if !s.cfg.WarmStart {
		return nil, nil
	}
	key := templateKey(s, img)
	for {
		h.mu.Lock()
		if t, ok := s.failed[key]; ok && time.Since(t) < templateFailRetry {
			h.mu.Unlock()
			return nil, nil
		}
		wait, busy := s.making[key]
		if !busy {
			if t, err := loadTemplate(s.cfg.TemplateDir, key); err == nil {
				h.mu.Unlock()
				now := time.Now()
				_ = os.Chtimes(filepath.Join(t.dir, templateMeta), now, now)
				return t, nil
			}
			done := make(chan struct{})
			s.making[key] = done
			h.mu.Unlock()
			t, err := h.makeTemplate(ctx, s, img, name, key)
			h.mu.Lock()
			delete(s.making, key)
			if err != nil && ctx.Err() == nil {
				s.failed[key] = time.Now()
			}
			h.mu.Unlock()
			close(done)
			return t, err
		}
		h.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// prewarm makes the templates of WarmImages in the background, one after
// the other, as an op that Shutdown cancels and waits for. A Create of one
// of them meanwhile waits for its template instead of making another.
func (h *Hypervisor) prewarm(s *setup) {
	if !s.cfg.WarmStart || len(s.cfg.WarmImages) == 0 {
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	h.mu.Lock()
	if h.setup != s {
		h.mu.Unlock()
		cancel(nil)
		return
	}
	o := h.begin("", cancel)
	h.mu.Unlock()
	go func() {
		defer h.end(o)
		defer cancel(nil)
		for _, name := range s.cfg.WarmImages {
			img, err := h.image(ctx, s, name)
			if err == nil {
				_, err = h.warmTemplate(ctx, s, img, name)
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				h.log.Error("pre-warming a VM template (warm_images): its VMs boot cold for now", "image", name, "err", err)
			}
		}
	}()
}

// loadTemplate reads the template of key in root, if it is complete.
func loadTemplate(root, key string) (*template, error) {
	dir := filepath.Join(root, key)
	b, err := os.ReadFile(filepath.Join(dir, templateMeta))
	if err != nil {
		return nil, err
	}
	t := &template{dir: dir}
	if err := json.Unmarshal(b, &t.meta); err != nil {
		return nil, fmt.Errorf("template %s: %w", dir, err)
	}
	if t.meta.Format != templateFormat || t.meta.Key != key || t.meta.BootID == "" {
		return nil, fmt.Errorf("template %s: not of this key or format", dir)
	}
	for _, f := range []string{t.disk(), t.ram(), t.state()} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("template %s: %w", dir, err)
		}
	}
	return t, nil
}

// makeTemplate boots a template VM of img, snapshots it and moves its
// files to the template's directory.
func (h *Hypervisor) makeTemplate(ctx context.Context, s *setup, img *vmimage.Image, name, key string) (_ *template, err error) {
	began := time.Now()
	h.mu.Lock()
	id := nesting.NewID()
	for h.taken(id) {
		id = nesting.NewID()
	}
	h.mu.Unlock()
	// In vms/ like any VM: an earlier daemon's half-made template is
	// cleaned up as a leftover.
	dir := vmDir(s.cfg.StateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the template's directory: %w", err)
	}
	defer os.RemoveAll(dir)
	spec := s.shape().spec(id, dir)
	spec.memFile, spec.memShared = filepath.Join(dir, memFile), true
	if err := h.overlay(ctx, s, img.Path, "raw", spec.disk); err != nil {
		return nil, err
	}
	p, _, err := h.boot(ctx, s, spec, s.cfg.BootTimeout)
	if err != nil {
		return nil, fmt.Errorf("booting the template VM: %w", err)
	}
	booted := time.Since(began)
	defer func() {
		if stopErr := p.stop(context.WithoutCancel(ctx), deleteGrace); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	if err := h.snapshot(ctx, p, dir); err != nil {
		return nil, fmt.Errorf("snapshotting the template VM: %w: QEMU's output: %s", err, tail(filepath.Join(dir, qemuLogFile), 10))
	}
	if err := p.stop(ctx, deleteGrace); err != nil {
		return nil, err
	}
	meta := templateMetadata{Format: templateFormat, Key: key, Image: name, Digest: img.Digest, BootID: id, Made: time.Now().UTC(), BootSeconds: booted.Seconds()}
	t, err := installTemplate(s.cfg.TemplateDir, dir, meta)
	if err != nil {
		return nil, err
	}
	h.pruneTemplates(s, t)
	h.log.Info("VM template made", "image", name, "digest", img.Digest, "template", key, "boot", booted.Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return t, nil
}

// overlay makes a qcow2 overlay of backing (of format backingFormat).
func (h *Hypervisor) overlay(ctx context.Context, s *setup, backing, backingFormat, path string) error {
	out, err := exec.CommandContext(ctx, s.qemuImg, "create", "-q", "-f", "qcow2", "-F", backingFormat, "-b", backing, path).CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("making the copy-on-write overlay of %s: %s: %w: %s", backing, s.qemuImg, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ignoreShared turns on x-ignore-shared: memory in a shared file is not
// migrated (the template's ram file holds it).
var ignoreShared = map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}

// eventRateLimit is QEMU's rate limit of VSERPORT_CHANGE events.
const eventRateLimit = time.Second

// quiesceTimeout bounds the wait for the guest agent to let go of its
// port and open it again.
const quiesceTimeout = time.Minute

// snapshot saves a booted template VM: the host ends its session on the
// agent's port, QEMU reports the guest closing the port and opening it
// again (the agent waits for its next host: the state every restored VM
// starts in), then the VM is paused and its device state migrated to
// dir/state.
func (h *Hypervisor) snapshot(ctx context.Context, p *proc, dir string) error {
	q, err := dialQMP(ctx, filepath.Join(dir, qmpFile))
	if err != nil {
		return err
	}
	defer q.Close()
	qctx, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	// QEMU rate-limits VSERPORT_CHANGE to one a second per port, sending
	// the latest state at the end of the second: once nothing came for
	// a second, nothing from before is pending, and the first event with
	// open true after the host let go says the agent opened its port
	// again (a close and the open after it may come as that one event).
	if err := q.quiet(qctx, eventRateLimit+100*time.Millisecond); err != nil {
		return err
	}
	p.closeMux()
	if err := q.waitEvent(qctx, "VSERPORT_CHANGE", portOpen(true)); err != nil {
		return fmt.Errorf("the agent did not open its port again after the host let go: %w", err)
	}
	if _, err := q.execute(ctx, "stop", nil); err != nil {
		return err
	}
	if _, err := q.execute(ctx, "migrate-set-capabilities", ignoreShared); err != nil {
		return err
	}
	state := filepath.Join(dir, templateState)
	if _, err := q.execute(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(state)}); err != nil {
		return err
	}
	if err := migrated(ctx, q, 20*time.Millisecond); err != nil {
		return fmt.Errorf("saving the VM's state: %w", err)
	}
	return nil
}

// incoming restores a VM QEMU started with -incoming defer, then runs it
// (it was paused when saved, so it would stay paused).
//
// A template's state (shared: x-ignore-shared, its memory already
// mapped) was saved with the agent waiting for its next host. A VM saved
// while a host held the agent's port (a job's snapshot) wakes up with the
// agent in that host's session: it must see the host go before the new
// one comes, or it would take the new host's bytes for the old session's.
// QEMU tells the guest at once that nobody holds the port; incoming then
// waits until the agent closed it and opened it again before anyone
// connects. QEMU reports the port's restored state (open) as it resumes
// the VM, which opens its one-second window of VSERPORT_CHANGE events:
// the agent's close and reopening come after it, as one event with the
// latest state (open) at the end of the window, or as two when the agent
// took longer.
func incoming(ctx context.Context, qmpPath, state string, shared bool) error {
	q, err := dialQMP(ctx, qmpPath)
	if err != nil {
		return err
	}
	defer q.Close()
	if shared {
		if _, err := q.execute(ctx, "migrate-set-capabilities", ignoreShared); err != nil {
			return err
		}
	}
	if _, err = q.execute(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(state)}); err != nil {
		return err
	}
	if err := migrated(ctx, q, 5*time.Millisecond); err != nil {
		return fmt.Errorf("restoring the VM's state: %w", err)
	}
	if _, err = q.execute(ctx, "cont", nil); err != nil || shared {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	if err := q.waitEvent(qctx, "VSERPORT_CHANGE", portOpen(true)); err != nil {
		return fmt.Errorf("the restored VM's port: %w", err)
	}
	if err := q.waitEvent(qctx, "VSERPORT_CHANGE", portOpen(true)); err != nil {
		return fmt.Errorf("the restored agent did not let go of its old host's session: %w", err)
	}
	return nil
}

// portOpen matches VSERPORT_CHANGE events of the agent's port.
func portOpen(open bool) func(json.RawMessage) bool {
	return func(b json.RawMessage) bool {
		var d struct {
			ID   string `json:"id"`
			Open bool   `json:"open"`
		}
		return json.Unmarshal(b, &d) == nil && d.ID == agentPortID && d.Open == open
	}
}

// migrated polls query-migrate until the migration completed.
func migrated(ctx context.Context, q *qmp, every time.Duration) error {
	for {
		raw, err := q.execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// installTemplate moves the snapshot's files from the template VM's
// directory to the template's, atomically: a template directory is
// complete or absent.
func installTemplate(root, vmDir string, meta templateMetadata) (*template, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, "tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for from, to := range map[string]string{overlayFile: templateDisk, memFile: templateRAM, templateState: templateState} {
		if err := os.Rename(filepath.Join(vmDir, from), filepath.Join(tmp, to)); err != nil {
			return nil, fmt.Errorf("installing the template: %w", err)
		}
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, templateMeta), append(b, '\n'), 0o600); err != nil {
		return nil, err
	}
	dir := filepath.Join(root, meta.Key)
	// VMs restored from a template of the same key (made by an earlier
	// daemon, then found incomplete) keep their open files.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("installing the template: %w", err)
	}
	return &template{dir: dir, meta: meta}, nil
}

// pruneTemplates removes the templates that made replaces (of the same
// image name), unfinished ones, and the least recently used beyond
// WarmTemplates. Running VMs restored from a removed template keep its
// files open until they end.
func (h *Hypervisor) pruneTemplates(s *setup, made *template) {
	root := s.cfg.TemplateDir
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	type kept struct {
		dir  string
		used time.Time
	}
	var all []kept
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		if dir == made.dir {
			continue
		}
		if strings.HasPrefix(e.Name(), "tmp-") {
			removeStaleTmp(dir)
			continue
		}
		t, err := loadTemplate(root, e.Name())
		if err != nil || t.meta.Image == made.meta.Image {
			os.RemoveAll(dir)
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, templateMeta))
		if err != nil {
			continue
		}
		all = append(all, kept{dir: dir, used: fi.ModTime()})
	}
	slices.SortFunc(all, func(a, b kept) int { return b.used.Compare(a.used) })
	for i, k := range all {
		if i+1 >= s.cfg.WarmTemplates { // made counts as one
			os.RemoveAll(k.dir)
		}
	}
}

// staleTmp is the age from which a template's unfinished directory is
// taken for the leftover of a daemon that died while installing it
// (installing takes milliseconds; another daemon sharing template_dir may
// be installing one right now).
const staleTmp = 10 * time.Minute

// removeStaleTmp removes an unfinished template directory that is stale.
func removeStaleTmp(dir string) {
	if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > staleTmp {
		os.RemoveAll(dir)
	}
}

// restore makes VM id of template t in dir: an overlay on the template's
// disk, and QEMU restoring the template's state with its memory mapped
// privately. Like boot, it returns once the agent answered (after
// Restored).
func (h *Hypervisor) restore(ctx context.Context, s *setup, t *template, id, dir string) (*proc, error) {
	spec := s.shape().spec(id, dir)
	spec.bootID, spec.memFile, spec.incoming, spec.ignoreShared = t.meta.BootID, t.ram(), t.state(), true
	if err := h.overlay(ctx, s, t.disk(), "qcow2", spec.disk); err != nil {
		return nil, err
	}
	p, _, err := h.boot(ctx, s, spec, s.cfg.BootTimeout)
	if err != nil {
		return nil, err
	}
	return p, nil
}
