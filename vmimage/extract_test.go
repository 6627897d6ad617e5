package vmimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sandbox is a directory holding the extraction root and a sentinel
// file beside it, which no archive may touch.
type sandbox struct {
	top, root, sentinel string
}

func newSandbox(t testing.TB) sandbox {
	// Not t.TempDir: fuzzing calls this for every input.
	top, err := os.MkdirTemp("", "vmimage-extract-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	s := sandbox{top: top, root: filepath.Join(top, "root"), sentinel: filepath.Join(top, "sentinel")}
	if err := os.Mkdir(s.root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.sentinel, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// check fails the test if anything beside root changed.
func (s sandbox) check(t testing.TB) {
	t.Helper()
	entries, err := os.ReadDir(s.top)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "root" && e.Name() != "sentinel" {
			t.Fatalf("%s was written outside the root", e.Name())
		}
	}
	if fi, err := os.Lstat(s.root); err != nil || !fi.IsDir() {
		t.Fatalf("the root is no longer a directory: %v %v", fi, err)
	}
	if b, err := os.ReadFile(s.sentinel); err != nil || string(b) != "untouched" {
		t.Fatalf("the sentinel beside the root changed: %q %v", b, err)
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	for _, c := range []struct {
		name    string
		entries []entry
		err     error  // nil: extracted, inside
		inside  string // a path that must exist inside root afterwards
	}{
		{"dot-dot", []entry{file("../sentinel", "pwned", 0o644)}, errEscape, ""},
		{"dot-dot deep", []entry{file("a/b/../../../sentinel", "pwned", 0o644)}, errEscape, ""},
		{"absolute", []entry{file("/abs", "x", 0o644)}, nil, "abs"},
		{"dot-dot inside", []entry{file("a/../b", "x", 0o644)}, nil, "b"},
		{"symlink dir out, absolute", []entry{symlink("lnk", "/"), file("lnk/evil", "x", 0o644)}, nil, "evil"},
		{"symlink dir out, relative", []entry{symlink("lnk", "../../.."), file("lnk/sentinel", "pwned", 0o644)}, nil, "sentinel"},
		{"symlink chain", []entry{symlink("a", "b"), symlink("b", "../c"), dir("c", 0o755), file("a/f", "x", 0o644)}, nil, "c/f"},
		{"symlink loop", []entry{symlink("a", "b"), symlink("b", "a"), file("a/f", "x", 0o644)}, errors.New("too many levels"), ""},
		{"symlink replaced by file", []entry{symlink("x", "../sentinel"), file("x", "mine", 0o644)}, nil, "x"},
		{"hard link out", []entry{hardlink("h", "../sentinel")}, errEscape, ""},
		{"hard link through symlink", []entry{symlink("lnk", "/.."), hardlink("h", "lnk/sentinel")}, errors.New("no such file"), ""},
		{"whiteout out", []entry{file("../.wh.sentinel", "", 0o644)}, errEscape, ""},
		{"whiteout through symlink", []entry{symlink("lnk", "../.."), file("lnk/.wh.sentinel", "", 0o644)}, nil, ""},
		{"opaque through symlink", []entry{symlink("lnk", "../.."), file("lnk/.wh..wh..opq", "", 0o644)}, nil, ""},
		{"file over directory parent", []entry{file("f", "x", 0o644), file("f/g", "x", 0o644)}, errors.New("not a directory"), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			x := newExtractor(s.root, nil)
			err := x.apply(bytes.NewReader(tarOf(t, c.entries...)), true)
			s.check(t)
			switch {
			case c.err == nil && err != nil:
				t.Fatalf("extracting: %v", err)
			case c.err != nil && (err == nil || !(errors.Is(err, c.err) || strings.Contains(err.Error(), c.err.Error()))):
				t.Fatalf("error %v, want %v", err, c.err)
			}
			if c.inside != "" {
				if _, err := os.Lstat(filepath.Join(s.root, c.inside)); err != nil {
					t.Errorf("%s not inside the root: %v", c.inside, err)
				}
			}
		})
	}
}

func TestExtractSparseAndReplace(t *testing.T) {
	s := newSandbox(t)
	x := newExtractor(s.root, nil)
	big := strings.Repeat("\x00", 1<<20) + "end"
	err := x.apply(bytes.NewReader(tarOf(t,
		file("sparse", big, 0o644),
		dir("d", 0o755), file("d/f", "x", 0o644),
		file("d", "now a file", 0o600), // a file replaces a directory
	)), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.finish(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(s.root, "sparse"))
	if err != nil || string(b) != big {
		t.Fatalf("sparse file: %d bytes %v", len(b), err)
	}
	if u, _ := usage(s.root); u.bytes > 64<<10 {
		t.Errorf("a file of 1 MiB of zeros takes %d bytes", u.bytes)
	}
	if b, _ := os.ReadFile(filepath.Join(s.root, "d")); string(b) != "now a file" {
		t.Errorf("d: %q", b)
	}
}

func TestExtractTimesAndOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	s := newSandbox(t)
	x := newExtractor(s.root, nil)
	err := x.apply(bytes.NewReader(tarOf(t,
		entry{name: "d/", typ: tar.TypeDir, mode: 0o2750, uid: 5, gid: 6},
		entry{name: "d/f", body: "x", typ: tar.TypeReg, mode: 0o4711, uid: 7, gid: 8},
		symlink("d/l", "f"),
	)), false)
	if err == nil {
		err = x.finish()
	}
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"d": fs.ModeDir | fs.ModeSetgid | 0o750, "d/f": fs.ModeSetuid | 0o711} {
		fi, err := os.Lstat(filepath.Join(s.root, p))
		if err != nil || fi.Mode() != want || !fi.ModTime().Equal(testTime) {
			t.Errorf("%s: %v %v %v, want %v at %v", p, fi.Mode(), fi.ModTime(), err, want, testTime)
		}
	}
	if fi, _ := os.Lstat(filepath.Join(s.root, "d/l")); !fi.ModTime().Equal(testTime) {
		t.Errorf("symlink time %v", fi.ModTime())
	}
}

// FuzzExtract extracts arbitrary tar archives (with whiteouts): nothing
// may be written, removed or followed outside the root, whatever the
// archive says.
func FuzzExtract(f *testing.F) {
	seeds := [][]entry{
		{file("../escape", "x", 0o644)},
		{symlink("lnk", "/"), file("lnk/f", "x", 0o644)},
		{symlink("lnk", "../.."), file("lnk/sentinel", "x", 0o644), hardlink("h", "lnk/sentinel")},
		{dir("a", 0o755), file("a/.wh..wh..opq", "", 0o644), file("a/.wh.b", "", 0o644), file(".wh...", "", 0o644)},
		{symlink("a", "b"), symlink("b", "a"), file("a/x", "", 0o644)},
		{file("f", "x", 0o644), hardlink("g", "f"), hardlink("f", "f")},
		{entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}, entry{name: "fifo", typ: tar.TypeFifo, mode: 0o644}},
	}
	for _, s := range seeds {
		f.Add(tarOf(f, s...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSandbox(t)
		x := newExtractor(s.root, nil)
		x.devices = false
		_ = x.apply(bytes.NewReader(data), true)
		_ = x.finish()
		s.check(t)
	})
}
