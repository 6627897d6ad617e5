// Package helper is what "berth helper …" does inside a job's environment:
// build and extract zip archives of artifacts and caches, and move
// artifacts to and from the coordinator. The runner generates stage scripts
// that call it; the shell executor runs the very binary of the runner.
//
// Archive paths are relative to the project directory; a pattern may use
// GitLab's globs (*, **, ?, [..], {a,b}); a path naming a directory takes
// the whole directory. Nothing outside the project directory is archived,
// and nothing is ever extracted outside the target directory.
package helper

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berthci/berth/ci"
)

// Selection says which files of a directory go into an archive.
type Selection struct {
	// Paths are files, directories or glob patterns, relative to Dir.
	Paths []string
	// Exclude patterns remove matching files (and directories' contents).
	Exclude []string
	// Untracked adds the files git does not track (git ls-files -o).
	Untracked bool
}

// ErrNothingToArchive is returned when a selection matches no file.
var ErrNothingToArchive = errors.New("no files to archive")

// Files lists the files (and symlinks and empty directories) selected
// under dir, as slash-separated relative paths, sorted. Directories are
// listed with a trailing "/" before their contents.
func Files(dir string, sel Selection) ([]string, error) {
	set := map[string]bool{}
	var walkErr error
	all, err := walk(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range sel.Paths {
		pat, err := cleanPattern(p)
		if err != nil {
			return nil, err
		}
		for _, f := range all {
			name := strings.TrimSuffix(f, "/")
			if ci.MatchGlob(pat, name) || strings.HasPrefix(name, pat+"/") || pat == "." {
				set[f] = true
				continue
			}
			// A pattern matching a parent directory takes its contents.
			for d := path.Dir(name); d != "."; d = path.Dir(d) {
				if ci.MatchGlob(pat, d) {
					set[f] = true
					break
				}
			}
		}
	}
	if sel.Untracked {
		out, err := exec.Command("git", "-C", dir, "ls-files", "-o", "-z").Output()
		if err != nil {
			walkErr = fmt.Errorf("listing untracked files: %w", err)
		}
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				set[filepath.ToSlash(f)] = true
			}
		}
	}
	if walkErr != nil {
		return nil, walkErr
	}
	for _, e := range sel.Exclude {
		pat, err := cleanPattern(e)
		if err != nil {
			return nil, err
		}
		for f := range set {
			name := strings.TrimSuffix(f, "/")
			if ci.MatchGlob(pat, name) || strings.HasPrefix(name, pat+"/") {
				delete(set, f)
				continue
			}
			for d := path.Dir(name); d != "."; d = path.Dir(d) {
				if ci.MatchGlob(pat, d) {
					delete(set, f)
					break
				}
			}
		}
	}
	// Directories only matter when empty; files imply their parents.
	files := make([]string, 0, len(set))
	for f := range set {
		if strings.HasSuffix(f, "/") {
			if hasChild(set, f) {
				continue
			}
		}
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}

func hasChild(set map[string]bool, dir string) bool {
	for f := range set {
		if f != dir && strings.HasPrefix(f, dir) {
			return true
		}
	}
	return false
}

// cleanPattern makes a path pattern relative and refuses escapes.
func cleanPattern(p string) (string, error) {
	p = filepath.ToSlash(strings.TrimSpace(p))
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q: must be relative to the project directory", p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q: outside the project directory", p)
	}
	return c, nil
}

// walk lists every file, symlink and directory under dir (directories with
// a trailing /), skipping .git.
func walk(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == ".git" {
				return filepath.SkipDir
			}
			out = append(out, rel+"/")
			return nil
		}
		out = append(out, rel)
		return nil
	})
	return out, err
}

// CreateZip writes the selected files of dir as a zip archive to w and
// returns how many entries it wrote.
func CreateZip(w io.Writer, dir string, files []string) (int, error) {
	zw := zip.NewWriter(w)
	n := 0
	dirs := map[string]bool{}
	addDir := func(d string) error {
		if d == "." || dirs[d] {
			return nil
		}
		dirs[d] = true
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(d)))
		if err != nil {
			return err
		}
		h, err := zip.FileInfoHeader(fi)
		if err != nil {
			return err
		}
		h.Name = d + "/"
		_, err = zw.CreateHeader(h)
		n++
		return err
	}
	for _, f := range files {
		name := strings.TrimSuffix(f, "/")
		// Parents first, so modes survive extraction.
		var parents []string
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := addDir(d); err != nil {
				return n, err
			}
		}
		full := filepath.Join(dir, filepath.FromSlash(name))
		fi, err := os.Lstat(full)
		if err != nil {
			return n, err
		}
		if fi.IsDir() {
			if err := addDir(name); err != nil {
				return n, err
			}
			continue
		}
		h, err := zip.FileInfoHeader(fi)
		if err != nil {
			return n, err
		}
		h.Name = name
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(full)
			if err != nil {
				return n, err
			}
			h.Method = zip.Store
			fw, err := zw.CreateHeader(h)
			if err != nil {
				return n, err
			}
			if _, err := io.WriteString(fw, target); err != nil {
				return n, err
			}
		case fi.Mode().IsRegular():
			h.Method = zip.Deflate
			fw, err := zw.CreateHeader(h)
			if err != nil {
				return n, err
			}
			src, err := os.Open(full)
			if err != nil {
				return n, err
			}
			_, err = io.Copy(fw, src)
			src.Close()
			if err != nil {
				return n, err
			}
		default:
			continue // sockets, devices, fifos are not archived
		}
		n++
	}
	return n, zw.Close()
}

// ExtractZip extracts the archive in file into dir. Entries that would land
// outside dir (absolute, "..", or through a symlink) are refused.
func ExtractZip(file, dir string) (int, error) {
	zr, err := zip.OpenReader(file)
	if err != nil {
		return 0, err
	}
	defer zr.Close()
	return extractZip(&zr.Reader, dir)
}

// ExtractZipFrom is ExtractZip of an archive of size bytes read from r.
func ExtractZipFrom(r io.ReaderAt, size int64, dir string) (int, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return 0, err
	}
	return extractZip(zr, dir)
}

func extractZip(zr *zip.Reader, dir string) (int, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range zr.File {
		name := filepath.ToSlash(f.Name)
		clean := path.Clean(strings.TrimSuffix(name, "/"))
		if strings.HasPrefix(name, "/") || clean == ".." || strings.HasPrefix(clean, "../") || clean == "." {
			return n, fmt.Errorf("archive entry %q: outside the target directory", f.Name)
		}
		target := filepath.Join(root, filepath.FromSlash(clean))
		if err := insideNoSymlink(root, filepath.Dir(target)); err != nil {
			return n, fmt.Errorf("archive entry %q: %w", f.Name, err)
		}
		mode := f.Mode()
		switch {
		case mode.IsDir():
			if err := os.MkdirAll(target, mode.Perm()|0o700); err != nil {
				return n, err
			}
		case mode&fs.ModeSymlink != 0:
			rc, err := f.Open()
			if err != nil {
				return n, err
			}
			b, err := io.ReadAll(io.LimitReader(rc, 4096))
			rc.Close()
			if err != nil {
				return n, err
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return n, err
			}
			_ = os.Remove(target)
			if err := os.Symlink(string(b), target); err != nil {
				return n, err
			}
		default:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return n, err
			}
			if fi, err := os.Lstat(target); err == nil && !fi.Mode().IsRegular() {
				if err := os.RemoveAll(target); err != nil {
					return n, err
				}
			}
			rc, err := f.Open()
			if err != nil {
				return n, err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode.Perm()|0o600)
			if err != nil {
				rc.Close()
				return n, err
			}
			_, err = io.Copy(out, rc)
			rc.Close()
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, err
			}
			_ = os.Chmod(target, mode.Perm())
			_ = os.Chtimes(target, f.Modified, f.Modified)
		}
		n++
	}
	return n, nil
}

// insideNoSymlink checks that dir is root or below it without passing
// through a symlink (an archive must not plant a link and write through it).
func insideNoSymlink(root, dir string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return errors.New("outside the target directory")
	}
	cur := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if part == "." || part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return errors.New("path goes through a symlink")
		}
	}
	return nil
}
