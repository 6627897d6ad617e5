package qemu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/vmimage"
)

// TestWarmStart: the first VM of an image makes its template, and every
// VM is then restored from it (QEMU runs with -incoming): each has its
// own host name, the host's clock, its own random numbers and its own
// disk; deleting one leaves the others working. A hypervisor of another
// shape on the same state directory makes another template and removes
// the one it replaces.
func TestWarmStart(t *testing.T) {
	imageDir := needBoot(t)
	state := stateDir(t)
	h := initHV(t, bootConfig(state, imageDir))
	ctx := context.Background()
	a, err := h.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	templates := func() []templateMetadata {
		root := filepath.Join(state, templatesDir)
		ents, _ := os.ReadDir(root)
		var out []templateMetadata
		for _, e := range ents {
			tm, err := loadTemplate(root, e.Name())
			if err != nil {
				t.Errorf("templates/%s: %v", e.Name(), err)
				continue
			}
			out = append(out, tm.meta)
		}
		return out
	}
	first := templates()
	if len(first) != 1 || first[0].Image != testImage {
		t.Fatalf("templates after the first VM: %+v", first)
	}
	b, err := h.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	if got := templates(); len(got) != 1 || got[0].Key != first[0].Key {
		t.Errorf("the second VM made another template: %+v", got)
	}
	random := map[string]bool{}
	for _, vm := range []struct{ id, dir string }{{a.ID, vmDir(state, a.ID)}, {b.ID, vmDir(state, b.ID)}} {
		args, err := readCmdline("/proc", qemuPID(t, vm.dir))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(args, "-incoming") {
			t.Errorf("VM %s was booted, not restored: %q", vm.id, args)
		}
	}
	for _, v := range []nesting.VirtualMachine{a, b} {
		vm := v.ID
		c := agent(t, v)
		info, err := c.Hello(ctx)
		if err != nil || info.Hostname != vm {
			t.Errorf("VM %s: Hello says host name %q, %v", vm, info.Hostname, err)
		}
		out, err := run(t, c, "hostname; cat /etc/hostname; date +%s; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; echo "+vm+" > /written; cat /written; cat /proc/sys/kernel/random/boot_id")
		if err != nil {
			t.Fatalf("VM %s: %v: %s", vm, err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 || lines[0] != vm || lines[1] != vm || lines[4] != vm {
			t.Errorf("VM %s: hostname, /etc/hostname, date, random, written file, boot id:\n%s", vm, out)
			continue
		}
		if sec, err := strconv.ParseInt(lines[2], 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Minute {
			t.Errorf("VM %s: the clock says %s, the host's %d", vm, lines[2], time.Now().Unix())
		}
		if random[lines[3]] {
			t.Errorf("two VMs of one template drew the same random bytes %s", lines[3])
		}
		random[lines[3]] = true
		if random[lines[5]] {
			t.Errorf("two VMs of one template have the boot id %s", lines[5])
		}
		random[lines[5]] = true
	}
	if err := h.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, agent(t, b), "cat /written")
	if err != nil || strings.TrimSpace(out) != b.ID {
		t.Errorf("VM %s after the other's deletion: %q, %v", b.ID, out, err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// Another shape: another template, which replaces the first.
	h2 := initHV(t, bootConfig(state, imageDir, `"memory_mb": 320`))
	c, err := h2.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, agent(t, c), "hostname"); err != nil || strings.TrimSpace(out) != c.ID {
		t.Errorf("VM of the second template: hostname %q, %v", out, err)
	}
	if got := templates(); len(got) != 1 || got[0].Key == first[0].Key {
		t.Errorf("templates after a change of memory_mb: %+v (first %s)", got, first[0].Key)
	}
}

// TestTemplateKey: the key changes with whatever the snapshot depends on.
func TestTemplateKey(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, time.Unix(1, 0), time.Unix(1, 0)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s := &setup{cfg: DefaultConfig(), qemu: file("qemu", "q"), accel: AccelTCG,
		boot: &vmimage.Boot{Kernel: file("kernel", "k"), Initramfs: file("initrd", "i")}}
	img := &vmimage.Image{Digest: "sha256:aa", Path: file("root.ext4", "r")}
	base := templateKey(s, img)
	if again := templateKey(s, img); again != base {
		t.Fatalf("the key is not stable: %s, %s", base, again)
	}
	// The image store's boot files (named by their content) are touched
	// when a daemon uses them: the key stays, or no template would
	// outlive its daemon.
	for _, f := range []string{s.boot.Kernel, s.boot.Initramfs} {
		if err := os.Chtimes(f, time.Now(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if again := templateKey(s, img); again != base {
		t.Errorf("touching the boot files changed the key")
	}
	for name, change := range map[string]func(s *setup, img *vmimage.Image){
		"digest":    func(_ *setup, img *vmimage.Image) { img.Digest = "sha256:bb" },
		"memory":    func(s *setup, _ *vmimage.Image) { s.cfg.MemoryMB++ },
		"cpus":      func(s *setup, _ *vmimage.Image) { s.cfg.CPUs++ },
		"machine":   func(s *setup, _ *vmimage.Image) { s.cfg.Machine = MachineQ35 },
		"network":   func(s *setup, _ *vmimage.Image) { s.cfg.Network = NetworkNone },
		"accel":     func(s *setup, _ *vmimage.Image) { s.accel = AccelKVM },
		"initramfs": func(s *setup, _ *vmimage.Image) { file("initrd", "a new agent") },
		"qemu":      func(s *setup, _ *vmimage.Image) { file("qemu", "an upgraded qemu") },
	} {
		s2, img2 := *s, *img
		boot := *s.boot
		s2.boot = &boot
		change(&s2, &img2)
		if k := templateKey(&s2, &img2); k == base {
			t.Errorf("a change of %s keeps the key", name)
		}
		file("initrd", "i")
		file("qemu", "q")
		if k := templateKey(s, img); k != base {
			t.Fatalf("after undoing the change of %s, the key is %s, not %s", name, k, base)
		}
	}
}

// TestPruneTemplates: a new template replaces the one of the same image,
// unfinished ones go, and at most warm_templates are kept, the least
// recently used going first.
func TestPruneTemplates(t *testing.T) {
	state := t.TempDir()
	cfg := DefaultConfig()
	root := filepath.Join(state, templatesDir)
	cfg.StateDir, cfg.TemplateDir, cfg.WarmTemplates = state, root, 3
	s := &setup{cfg: cfg, making: map[string]chan struct{}{}, failed: map[string]time.Time{}}
	h := New(nil)
	install := func(key, image string, used time.Time) *template {
		vm := t.TempDir()
		for _, f := range []string{overlayFile, memFile, templateState} {
			os.WriteFile(filepath.Join(vm, f), []byte(f), 0o600)
		}
		tm, err := installTemplate(root, vm, templateMetadata{Format: templateFormat, Key: key, Image: image, BootID: "nesting-x"})
		if err != nil {
			t.Fatal(err)
		}
		os.Chtimes(filepath.Join(tm.dir, templateMeta), used, used)
		return tm
	}
	now := time.Now()
	install("k1", "a", now.Add(-4*time.Hour))
	install("k2", "b", now.Add(-3*time.Hour))
	install("k3", "c", now.Add(-2*time.Hour))
	install("k4", "d", now.Add(-1*time.Hour))
	os.MkdirAll(filepath.Join(root, "tmp-old"), 0o700)
	os.Chtimes(filepath.Join(root, "tmp-old"), now.Add(-time.Hour), now.Add(-time.Hour))
	os.MkdirAll(filepath.Join(root, "tmp-new"), 0o700) // another daemon's, being installed
	made := install("k5", "c", now)                    // replaces k3
	h.pruneTemplates(s, made)
	ents, _ := os.ReadDir(root)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := []string{"k2", "k4", "k5", "tmp-new"}; !slices.Equal(got, want) {
		t.Errorf("templates kept: %v, want %v (k1 least recently used, k3 replaced, tmp-old a stale unfinished one)", got, want)
	}
	if _, err := loadTemplate(root, "k5"); err != nil {
		t.Errorf("the new template: %v", err)
	}
	if _, err := loadTemplate(root, "k2-other"); err == nil {
		t.Error("a missing template loads")
	}
	os.Remove(filepath.Join(root, "k4", templateState))
	if _, err := loadTemplate(root, "k4"); err == nil {
		t.Error("a template without its state loads")
	}
}
