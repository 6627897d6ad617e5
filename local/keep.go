package local

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthci/berth/internal/flock"
)

// Build directories kept between runs. A run's runner fetches into build
// directories <builds>/<runner>/<slot>/<project>; berth run keeps them
// (the checkouts with their .git) between runs of the same pipeline
// directory, as a runner keeps its builds directory: the next run's
// first jobs fetch what changed into a checkout that is there instead of
// making a repository and fetching everything, and nothing is removed
// and made again. Jobs see what GitLab's fetch strategy gives them:
// `git clean -ffdx` and `git checkout -f` reset what earlier jobs left.
// Only the shell executor uses them (containers have their own volumes).

// keptMaxAge is how long kept build directories nobody used stay.
const keptMaxAge = 7 * 24 * time.Hour

// KeepDir is where the build directories of runs of dir are kept, below
// root (the user's cache directory for berth run); unused ones older than
// a week are removed.
func KeepDir(root, dir string) string {
	sum := sha256.Sum256([]byte(dir))
	pruneKept(root)
	return filepath.Join(root, hex.EncodeToString(sum[:8]))
}

// pruneKept removes kept directories nobody used for keptMaxAge (each
// use touches its lock file).
func pruneKept(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(root, e.Name())
		fi, err := os.Stat(filepath.Join(p, "lock"))
		if err != nil {
			fi, err = os.Stat(p)
		}
		if err == nil && time.Since(fi.ModTime()) > keptMaxAge {
			if lk, err := flock.TryLock(filepath.Join(p, "lock"), 0o600); err == nil {
				os.RemoveAll(filepath.Join(p, "builds"))
				lk.Close()
				os.RemoveAll(p)
			}
		}
	}
}

// kept is a run's hold on kept build directories.
type kept struct {
	root string
	dir  string
	lock *os.File // flock: another run keeps nothing while it is held
}

// commitDate dates berth run's commit of tree: as the last run dated its
// commit of the same tree (the same files then make the same commit,
// which the kept checkouts hold, so their first fetch brings nothing),
// else now, remembered for the next run.
func (k *kept) commitDate(tree string) time.Time {
	p := filepath.Join(k.root, "commit")
	if b, err := os.ReadFile(p); err == nil {
		var t string
		var unix int64
		if n, _ := fmt.Sscanf(string(b), "%s %d", &t, &unix); n == 2 && t == tree && unix > 0 {
			return time.Unix(unix, 0)
		}
	}
	now := time.Now()
	_ = os.WriteFile(p, fmt.Appendf(nil, "%s %d\n", tree, now.Unix()), 0o600)
	return now
}

// borrowKept moves the build directories kept in keepDir to into; ok is
// false when another run holds them, or the system has no file locks
// (this run then starts from none and keeps nothing).
func borrowKept(keepDir, into string) (*kept, bool) {
	if err := os.MkdirAll(keepDir, 0o700); err != nil {
		return nil, false
	}
	lk, err := flock.TryLock(filepath.Join(keepDir, "lock"), 0o600)
	if err != nil {
		return nil, false
	}
	now := time.Now()
	_ = os.Chtimes(filepath.Join(keepDir, "lock"), now, now)
	k := &kept{root: keepDir, dir: filepath.Join(keepDir, "builds"), lock: lk}
	if err := os.MkdirAll(filepath.Dir(into), 0o700); err != nil {
		lk.Close()
		return nil, false
	}
	if err := os.Rename(k.dir, into); err != nil && !os.IsNotExist(err) {
		// Kept on another file system, say: start from none, keep this
		// run's.
		os.RemoveAll(k.dir)
	}
	return k, true
}

// giveBack keeps the build directories in from for the next run.
func (k *kept) giveBack(from string) {
	defer k.lock.Close()
	if _, err := os.Stat(from); err != nil {
		return
	}
	os.RemoveAll(k.dir)
	if err := os.Rename(from, k.dir); err != nil {
		os.RemoveAll(k.dir)
	}
}
