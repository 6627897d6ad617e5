package bundle

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHelperStaticAndDynamic(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b1, err := Helper(self, dir)
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "helper-0000000000000000")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-8 * 24 * time.Hour)
	os.Chtimes(stale, old, old)
	b2, err := Helper(self, dir)
	if err != nil || b1 != b2 {
		t.Fatalf("second bundle %s %v, want the first %s", b2, err, b1)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a week-old bundle of another binary survives: %v", err)
	}
	f, _ := elf.Open(self)
	interp, _ := elfInterp(f)
	f.Close()
	if interp == "" {
		if _, err := os.Stat(filepath.Join(b1, "berth")); err != nil {
			t.Fatal(err)
		}
		return
	}
	w, err := os.ReadFile(filepath.Join(b1, "berth"))
	if err != nil || !strings.HasPrefix(string(w), "#!/bin/sh") || !strings.Contains(string(w), "--library-path") {
		t.Fatalf("wrapper %q %v", w, err)
	}
	libs, _ := filepath.Glob(filepath.Join(b1, "lib", "*"))
	if len(libs) < 2 {
		t.Fatalf("bundle has %v; want the loader and libc at least", libs)
	}
	// The bundle runs on the host as it would in a container.
	out, err := exec.Command(filepath.Join(b1, "lib", filepath.Base(interp)), "--library-path", filepath.Join(b1, "lib"), filepath.Join(b1, "bin", "berth"), "-test.run=^$").CombinedOutput()
	if err != nil {
		t.Fatalf("running the bundled binary: %v\n%s", err, out)
	}
}

// TestHelperWrapperAnywhere runs the wrapper of a dynamically linked
// binary from a copy of the bundle elsewhere, by absolute and relative
// path and through a symbolic link: it finds the loader beside itself.
func TestHelperWrapperAnywhere(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	interp, _ := elfInterp(f)
	f.Close()
	if interp == "" {
		t.Skip("this test binary is statically linked: its bundle has no wrapper")
	}
	b, err := Helper(self, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(t.TempDir(), "some where", "else")
	if err := os.MkdirAll(filepath.Dir(moved), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", b, moved).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	link := filepath.Join(t.TempDir(), "berth")
	if err := os.Symlink(filepath.Join(moved, "berth"), link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, path string }{
		{"/", filepath.Join(moved, "berth")},
		{moved, "./berth"},
		{"/", link},
	} {
		cmd := exec.Command(c.path, "-test.run=^TestNothing$", "-test.v")
		cmd.Dir = c.dir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "testing: warning: no tests to run") {
			t.Errorf("%s from %s: %v\n%s", c.path, c.dir, err, out)
		}
	}
}

func TestWrapperIsPOSIX(t *testing.T) {
	w := wrapper("ld-linux-x86-64.so.2")
	if strings.Contains(w, "/usr/local/berth") {
		t.Fatalf("the wrapper names a mount point: %s", w)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	if out, err := exec.Command(sh, "-n", "-c", w).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v %s\n%s", err, out, w)
	}
}

// A binary's sum is remembered while the file stays the same, and
// computed again when it changes.
func TestBinarySumRemembered(t *testing.T) {
	state := t.TempDir()
	bin := filepath.Join(t.TempDir(), "berth")
	if err := os.WriteFile(bin, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	want1, _ := fileSum(bin)
	for range 2 {
		if got, err := binarySum(bin, state); err != nil || got != want1 {
			t.Fatalf("sum %q (%v), want %q", got, err, want1)
		}
	}
	memos, _ := filepath.Glob(filepath.Join(state, sumPrefix+"*"))
	if len(memos) != 1 {
		t.Fatalf("memo files %v, want one", memos)
	}
	// A remembered sum is what is used: the memo is the cache.
	if err := os.WriteFile(memos[0], []byte(strings.Repeat("ab", 32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := binarySum(bin, state); got != strings.Repeat("ab", 32) {
		t.Fatalf("sum %q: the memo was not used", got)
	}
	// A new build (another size, time and file) is hashed again.
	next := bin + ".new"
	if err := os.WriteFile(next, []byte("two!"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, bin); err != nil {
		t.Fatal(err)
	}
	want2, _ := fileSum(bin)
	if got, err := binarySum(bin, state); err != nil || got != want2 || want2 == want1 {
		t.Fatalf("after a rebuild: %q (%v), want %q", got, err, want2)
	}
	// A memo nobody used for a week goes with the bundles.
	old := time.Now().Add(-8 * 24 * time.Hour)
	os.Chtimes(memos[0], old, old)
	pruneBundles(state, "")
	if _, err := os.Stat(memos[0]); !os.IsNotExist(err) {
		t.Errorf("a stale memo stayed (%v)", err)
	}
}
