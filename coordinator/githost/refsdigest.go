package githost

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// RefsDigest names what a job's fetch from a project's repository would
// read (refspecs, depth, commit sha), for GitInfo.RefsDigest: an equal
// digest means the fetch would bring nothing new. "" when it cannot tell,
// or without git hosting; refsDigest has the details.
func (h *Host) RefsDigest(projectID int64, refspecs []string, depth int, sha string) string {
	if h.dir == "" {
		return ""
	}
	return refsDigest(h.RepoPath(projectID), refspecs, depth, sha)
}

// refsDigest names what a job's fetch would read from the bare repository
// dir: the value of every ref its refspecs' sources name (a wildcard's
// whole namespace), read from the loose ref files and packed-refs, with
// the job's commit, depth and refspecs. An equal digest means the fetch
// would bring exactly what the same digest's fetch brought: the same refs
// at the same commits (objects are named by their content). It starts no
// process: a few small reads (packed-refs only when a ref is not loose or
// a refspec is a wildcard). "" when it cannot tell (the runner then
// fetches): a repository in the reftable format, a refspec it does not
// understand.
//
// A runner that fetched into a build directory with a digest skips the
// next job's fetch there when the job comes with the same digest and its
// own refs are still those that fetch wrote (runner/script.go). The
// digest depends on nothing but content, so a recreated repository with
// the same refs (berth run's, from one run to the next) gives the same.
func refsDigest(dir string, refspecs []string, depth int, sha string) string {
	if dir == "" || sha == "" || len(refspecs) == 0 {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "reftable")); err == nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err != nil {
		return ""
	}
	r := refReader{dir: dir}
	var b bytes.Buffer
	fmt.Fprintf(&b, "berth-refs-v2\x00%s\x00%d\x00", sha, depth)
	for _, rs := range refspecs {
		src, _, _ := strings.Cut(strings.TrimPrefix(rs, "+"), ":")
		fmt.Fprintf(&b, "refspec\x00%s\x00", rs)
		if !strings.HasPrefix(src, "refs/") || strings.Contains(src, "..") {
			return ""
		}
		var refs map[string]string
		var err error
		if prefix, ok := strings.CutSuffix(src, "*"); ok {
			if strings.Contains(prefix, "*") || !strings.HasSuffix(prefix, "/") {
				return ""
			}
			refs, err = r.prefixed(prefix)
		} else if strings.Contains(src, "*") {
			return ""
		} else {
			refs, err = r.exact(src)
		}
		if err != nil {
			return ""
		}
		names := make([]string, 0, len(refs))
		for n := range refs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(&b, "%s\x00%s\x00", n, refs[n])
		}
		b.WriteString("end\x00")
	}
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:])
}

// refReader reads refs of a repository in git's files format.
type refReader struct {
	dir    string
	packed map[string]string // nil until read
}

// loose reads a loose ref file: its value ("" when there is none).
func (r *refReader) loose(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.dir, filepath.FromSlash(name)))
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readPacked reads packed-refs once (peeled lines are left out: they
// follow from the tag objects).
func (r *refReader) readPacked() error {
	if r.packed != nil {
		return nil
	}
	r.packed = map[string]string{}
	f, err := os.Open(filepath.Join(r.dir, "packed-refs"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || line[0] == '^' {
			continue
		}
		if val, name, ok := strings.Cut(line, " "); ok {
			r.packed[name] = val
		}
	}
	return sc.Err()
}

func (r *refReader) exact(name string) (map[string]string, error) {
	v, err := r.loose(name)
	if err != nil {
		return nil, err
	}
	if v == "" {
		if err := r.readPacked(); err != nil {
			return nil, err
		}
		v = r.packed[name]
	}
	if v == "" {
		return map[string]string{}, nil
	}
	return map[string]string{name: v}, nil
}

func (r *refReader) prefixed(prefix string) (map[string]string, error) {
	if err := r.readPacked(); err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for n, v := range r.packed {
		if strings.HasPrefix(n, prefix) {
			refs[n] = v
		}
	}
	root := filepath.Join(r.dir, filepath.FromSlash(prefix))
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p == root {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || strings.HasSuffix(p, ".lock") {
			return nil
		}
		rel, err := filepath.Rel(r.dir, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		v, err := r.loose(name)
		if err != nil {
			return err
		}
		if v != "" {
			refs[name] = v // a loose ref wins over its packed value
		}
		return nil
	})
	return refs, err
}
