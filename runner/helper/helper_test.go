package helper

import (
	"archive/zip"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

func TestFilesSelection(t *testing.T) {
	dir := t.TempDir()
	testenv.WriteFiles(t, dir, map[string]string{
		"bin/app": "x", "bin/app.debug": "x", "out/a/report.xml": "x", "out/b/c/report.xml": "x",
		"out/b/c/log.txt": "x", "top.txt": "x", "vendor/m/x.go": "x", ".git/config": "x",
	})
	for _, tc := range []struct {
		sel  Selection
		want string
	}{
		{Selection{Paths: []string{"bin/"}}, "bin/app bin/app.debug"},
		{Selection{Paths: []string{"bin"}, Exclude: []string{"**/*.debug"}}, "bin/app"},
		{Selection{Paths: []string{"out/**/report.xml"}}, "out/a/report.xml out/b/c/report.xml"},
		{Selection{Paths: []string{"*.txt"}}, "top.txt"},
		{Selection{Paths: []string{"out"}, Exclude: []string{"out/b"}}, "out/a/report.xml"},
		{Selection{Paths: []string{"."}, Exclude: []string{"out", "bin", "vendor"}}, "top.txt"},
		{Selection{Paths: []string{"nothing/*"}}, ""},
	} {
		got, err := Files(dir, tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.sel, strings.Join(got, " "), tc.want)
		}
	}
	for _, bad := range []string{"../x", "/etc/passwd", "a/../../x"} {
		if _, err := Files(dir, Selection{Paths: []string{bad}}); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}

func TestUntracked(t *testing.T) {
	git := testenv.LookPath(t, "git")
	dir := t.TempDir()
	testenv.WriteFiles(t, dir, map[string]string{"tracked.txt": "x", "new/untracked.txt": "y"})
	for _, args := range [][]string{{"init", "-q"}, {"add", "tracked.txt"}} {
		if out, err := exec.Command(git, append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	got, err := Files(dir, Selection{Untracked: true})
	if err != nil || strings.Join(got, " ") != "new/untracked.txt" {
		t.Fatalf("%v %v", got, err)
	}
}

func TestZipRoundTripAndCache(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"a/b/c.txt": "hello", "d.sh": "#!/bin/sh"})
	os.Chmod(filepath.Join(src, "d.sh"), 0o755)
	os.Symlink("b/c.txt", filepath.Join(src, "a", "link"))
	cache := filepath.Join(t.TempDir(), "key", "cache.zip")
	var out bytes.Buffer
	if err := CacheArchive(context.Background(), &out, cache, src, Selection{Paths: []string{"a", "d.sh"}}); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "nokey", "cache.zip")
	if err := CacheExtract(context.Background(), &out, []string{missing, cache}, dst); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fallback") {
		t.Errorf("fallback use not reported: %s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(dst, "a", "b", "c.txt"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("%q %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "d.sh")); fi == nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode not kept: %v", fi)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "a", "link")); l != "b/c.txt" {
		t.Errorf("symlink %q", l)
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	for _, name := range []string{"../evil", "/abs", "a/../../evil"} {
		p := filepath.Join(t.TempDir(), "bad.zip")
		f, _ := os.Create(p)
		zw := zip.NewWriter(f)
		w, _ := zw.Create(name)
		w.Write([]byte("x"))
		zw.Close()
		f.Close()
		dst := t.TempDir()
		if _, err := ExtractZip(p, dst); err == nil {
			t.Errorf("entry %q extracted", name)
		}
	}
	// A symlink planted by one entry must not be written through.
	p := filepath.Join(t.TempDir(), "link.zip")
	f, _ := os.Create(p)
	zw := zip.NewWriter(f)
	h := &zip.FileHeader{Name: "l"}
	h.SetMode(os.ModeSymlink | 0o777)
	w, _ := zw.CreateHeader(h)
	w.Write([]byte(t.TempDir()))
	w, _ = zw.Create("l/escaped")
	w.Write([]byte("x"))
	zw.Close()
	f.Close()
	if _, err := ExtractZip(p, t.TempDir()); err == nil {
		t.Error("write through a planted symlink accepted")
	}
}
