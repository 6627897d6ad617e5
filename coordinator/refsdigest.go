package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berthci/berth/internal/fsid"
)

// refsDigest names the state of the refs a job's fetch would read from the
// bare repository dir: the loose ref files its refspecs' sources name (a
// wildcard's whole directory) and packed-refs, by name, size, modification
// time and inode, with the job's commit, depth and refspecs. Every ref
// update, by Berth or by any git process, replaces a loose ref file or
// packed-refs (git writes a lock file and renames it), so an equal digest
// means the fetch would bring exactly what the same digest's fetch
// brought. It reads no ref and starts no process: a few stat calls. ""
// when it cannot tell (the runner then fetches).
//
// A runner that fetched into a build directory with a digest skips the
// next job's fetch there when the job comes with the same digest and its
// own refs are still those that fetch wrote (runner/script.go).
func refsDigest(dir string, refspecs []string, depth int, sha string) string {
	if dir == "" || sha == "" || len(refspecs) == 0 {
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "berth-refs-v1\x00%s\x00%d\x00", sha, depth)
	// The repository itself by identity (a project recreated at the same
	// path is another repository), not by its changing modification time.
	root, err := os.Stat(dir)
	if err != nil {
		return ""
	}
	fmt.Fprintf(h, "repo\x00%d\x00", fsid.Inode(root))
	if !statInto(h, dir, "packed-refs") {
		return ""
	}
	for _, rs := range refspecs {
		src, _, _ := strings.Cut(strings.TrimPrefix(rs, "+"), ":")
		fmt.Fprintf(h, "refspec\x00%s\x00", rs)
		if !strings.HasPrefix(src, "refs/") || strings.Contains(src, "..") {
			return ""
		}
		if prefix, ok := strings.CutSuffix(src, "*"); ok {
			if strings.Contains(prefix, "*") || !strings.HasSuffix(prefix, "/") {
				return ""
			}
			if !walkInto(h, dir, prefix) {
				return ""
			}
			continue
		}
		if strings.Contains(src, "*") || !statInto(h, dir, src) {
			return ""
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// statInto adds what identifies the file dir/name (or its absence).
func statInto(h hash.Hash, dir, name string) bool {
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(name)))
	if os.IsNotExist(err) {
		fmt.Fprintf(h, "%s\x00-\x00", name)
		return true
	}
	if err != nil {
		return false
	}
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00%o\x00", name, fi.Size(), fi.ModTime().UnixNano(), fsid.Inode(fi), fi.Mode())
	return true
}

// walkInto adds every file below dir/prefix, in name order.
func walkInto(h hash.Hash, dir, prefix string) bool {
	root := filepath.Join(dir, filepath.FromSlash(prefix))
	var names []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p == root {
				return filepath.SkipDir
			}
			return err
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return false
	}
	sort.Strings(names)
	fmt.Fprintf(h, "dir\x00%s\x00%d\x00", prefix, len(names))
	for _, n := range names {
		if !statInto(h, dir, n) {
			return false
		}
	}
	return true
}
