package gitrepo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxFileSize bounds the size of a file FS reads from a commit.
const MaxFileSize = 16 << 20

// FS returns the files of commit sha as an fs.FS (also fs.ReadDirFS and
// fs.ReadFileFS). The tree is listed once; file contents are read from
// git when opened. Symbolic links read as their target path, submodules
// are left out. ctx bounds every read.
func (r *Repo) FS(ctx context.Context, sha string) (fs.FS, error) {
	if !IsSha(sha) {
		return nil, fmt.Errorf("reading tree of %q: %w", sha, ErrNotFound)
	}
	out, err := r.git(ctx, nil, nil, "ls-tree", "-r", "-t", "-l", "-z", "--full-tree", sha)
	if err != nil {
		return nil, fmt.Errorf("reading tree of %s: %w", sha, ErrNotFound)
	}
	t, err := parseTree(out)
	if err != nil {
		return nil, fmt.Errorf("reading tree of %s: %w", sha, err)
	}
	return &commitFS{ctx: ctx, repo: r, tree: t}, nil
}

type entry struct {
	name string // base name
	dir  bool
	obj  string
	size int64
	mode fs.FileMode
}

// tree maps directory paths ("." for the root) to their sorted entries,
// and file paths to their entry.
type tree struct {
	dirs  map[string][]*entry
	files map[string]*entry
}

// parseTree reads `git ls-tree -r -t -l -z` output:
// "<mode> SP <type> SP <object> SP+ <size> TAB <path> NUL".
func parseTree(out []byte) (*tree, error) {
	t := &tree{dirs: map[string][]*entry{".": nil}, files: map[string]*entry{}}
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		meta, p, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			return nil, fmt.Errorf("malformed ls-tree record %q", rec)
		}
		f := strings.Fields(string(meta))
		if len(f) != 4 {
			return nil, fmt.Errorf("malformed ls-tree record %q", rec)
		}
		name := string(p)
		if !fs.ValidPath(name) || name == "." {
			continue
		}
		e := &entry{name: path.Base(name), obj: f[2]}
		switch f[1] {
		case "tree":
			e.dir, e.mode = true, fs.ModeDir|0o555
			if _, ok := t.dirs[name]; !ok {
				t.dirs[name] = nil
			}
		case "blob":
			e.mode = 0o444
			if f[0] == "100755" {
				e.mode = 0o555
			}
			size, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("malformed size in %q", rec)
			}
			e.size = size
			t.files[name] = e
		default:
			continue // submodule commits
		}
		parent := path.Dir(name)
		t.dirs[parent] = append(t.dirs[parent], e)
	}
	for _, es := range t.dirs {
		slices.SortFunc(es, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	}
	return t, nil
}

type commitFS struct {
	ctx  context.Context
	repo *Repo
	tree *tree

	mu    sync.Mutex
	cache map[string][]byte // object → content
}

// BlobID returns the git blob id of file name of the commit (a symbolic
// link's is the blob of its target path), as ci.BlobIDFS: cache keys from
// file contents need no read of the files.
func (c *commitFS) BlobID(name string) (string, bool) {
	e, ok := c.tree.files[name]
	if !ok {
		return "", false
	}
	return e.obj, true
}

// ErrTooLarge is a file over MaxFileSize.
var ErrTooLarge = errors.New("file too large")

func (c *commitFS) read(e *entry) ([]byte, error) {
	if e.size > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes, over %d: %w", e.name, e.size, MaxFileSize, ErrTooLarge)
	}
	c.mu.Lock()
	b, ok := c.cache[e.obj]
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	b, err := c.repo.git(c.ctx, nil, nil, "cat-file", "blob", e.obj)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.cache == nil {
		c.cache = map[string][]byte{}
	}
	c.cache[e.obj] = b
	c.mu.Unlock()
	return b, nil
}

// Open implements fs.FS.
func (c *commitFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if es, ok := c.tree.dirs[name]; ok {
		return &dirFile{info: info{e: &entry{name: path.Base(name), dir: true, mode: fs.ModeDir | 0o555}}, entries: es}, nil
	}
	e, ok := c.tree.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	b, err := c.read(e)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &file{info: info{e: e}, r: bytes.NewReader(b)}, nil
}

// Stat implements fs.StatFS without reading the file.
func (c *commitFS) Stat(name string) (fs.FileInfo, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrInvalid}
	}
	if _, ok := c.tree.dirs[name]; ok {
		return info{e: &entry{name: path.Base(name), dir: true, mode: fs.ModeDir | 0o555}}, nil
	}
	if e, ok := c.tree.files[name]; ok {
		return info{e: e}, nil
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

// ReadFile implements fs.ReadFileFS.
func (c *commitFS) ReadFile(name string) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrInvalid}
	}
	e, ok := c.tree.files[name]
	if !ok {
		if _, dir := c.tree.dirs[name]; dir {
			return nil, &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("is a directory")}
		}
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	b, err := c.read(e)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return slices.Clone(b), nil
}

// ReadDir implements fs.ReadDirFS.
func (c *commitFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrInvalid}
	}
	es, ok := c.tree.dirs[name]
	if !ok {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	out := make([]fs.DirEntry, len(es))
	for i, e := range es {
		out[i] = info{e: e}
	}
	return out, nil
}

// info is both the fs.FileInfo and the fs.DirEntry of an entry.
type info struct{ e *entry }

func (i info) Name() string               { return i.e.name }
func (i info) Size() int64                { return i.e.size }
func (i info) Mode() fs.FileMode          { return i.e.mode }
func (i info) ModTime() time.Time         { return time.Time{} }
func (i info) IsDir() bool                { return i.e.dir }
func (i info) Sys() any                   { return nil }
func (i info) Type() fs.FileMode          { return i.e.mode.Type() }
func (i info) Info() (fs.FileInfo, error) { return i, nil }

type file struct {
	info
	r *bytes.Reader
}

func (f *file) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *file) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *file) Close() error               { return nil }

type dirFile struct {
	info
	entries []*entry
	off     int
}

func (d *dirFile) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *dirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.e.name, Err: fmt.Errorf("is a directory")}
}
func (d *dirFile) Close() error { return nil }

// ReadDir implements fs.ReadDirFile.
func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.off:]
	if n > 0 && len(rest) == 0 {
		return nil, io.EOF
	}
	if n > 0 && n < len(rest) {
		rest = rest[:n]
	}
	d.off += len(rest)
	out := make([]fs.DirEntry, len(rest))
	for i, e := range rest {
		out[i] = info{e: e}
	}
	return out, nil
}
