package ci

import (
	"context"
	"errors"
	"io/fs"
	"strings"
)

var errFound = errors.New("found")

// FSExists answers rules:exists from a file system rooted at the
// repository: true when any file matches one of the patterns (MatchGlob
// syntax, a leading / ignored). The .git directory is skipped.
func FSExists(fsys fs.FS) ExistsFunc {
	return func(ctx context.Context, patterns []string) (bool, error) {
		pats := make([]string, 0, len(patterns))
		for _, p := range patterns {
			pats = append(pats, strings.TrimPrefix(p, "/"))
		}
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // unreadable entries do not exist for rules
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if d.IsDir() {
				if p == ".git" {
					return fs.SkipDir
				}
				return nil
			}
			for _, pat := range pats {
				if MatchGlob(pat, p) {
					return errFound
				}
			}
			return nil
		})
		if errors.Is(err, errFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, nil
	}
}
