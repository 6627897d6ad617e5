package helper

import (
	"archive/zip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzExtractZipStaysInside builds archives with arbitrary entry names,
// directories and symlinks (including a link to a directory outside the
// target followed by an entry written through it) and checks that
// extraction never creates anything outside the target directory.
func FuzzExtractZipStaysInside(f *testing.F) {
	f.Add("a.txt\nb/c.txt\nb/", "link", "../outside", []byte{0, 0, 1})
	f.Add("../evil\n/abs\nok", "l", "/etc", []byte{0, 2, 0})
	f.Add("x/../../y\n.\n..", "a/b", "..", []byte{2, 1, 0})
	f.Fuzz(func(t *testing.T, names, linkName, linkTarget string, kinds []byte) {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		outside := filepath.Join(base, "outside")
		for _, d := range []string{root, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		zpath := filepath.Join(base, "a.zip")
		zf, err := os.Create(zpath)
		if err != nil {
			t.Fatal(err)
		}
		zw := zip.NewWriter(zf)
		add := func(name string, mode os.FileMode, body string) {
			h := &zip.FileHeader{Name: name, Method: zip.Store}
			h.SetMode(mode)
			w, err := zw.CreateHeader(h)
			if err == nil {
				_, _ = w.Write([]byte(body))
			}
		}
		for i, n := range strings.Split(names, "\n") {
			if n == "" || len(n) > 200 {
				continue
			}
			kind := byte(0)
			if len(kinds) > 0 {
				kind = kinds[i%len(kinds)] % 3
			}
			switch kind {
			case 0:
				add(n, 0o644, "data")
			case 1:
				add(strings.TrimSuffix(n, "/")+"/", os.ModeDir|0o755, "")
			case 2:
				add(n, os.ModeSymlink|0o777, linkTarget)
			}
		}
		if linkName != "" && len(linkName) < 200 {
			add(linkName, os.ModeSymlink|0o777, outside)
			add(strings.TrimSuffix(linkName, "/")+"/pwned", 0o644, "pwned")
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		zf.Close()

		_, _ = ExtractZip(zpath, root) // errors are fine; escapes are not

		if entries, _ := os.ReadDir(outside); len(entries) != 0 {
			t.Fatalf("extraction wrote outside the target: %v", entries)
		}
		entries, _ := os.ReadDir(base)
		for _, e := range entries {
			switch e.Name() {
			case "root", "outside", "a.zip":
			default:
				t.Fatalf("extraction created %s beside the target", e.Name())
			}
		}
	})
}
