package ci

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
)

// Cache keys from files, as GitLab computes them (its pipeline seed's
// Build::Cache): cache:key:files is a digest of the files' contents (their
// git blob ids), cache:key:files_commits a digest of the last commits that
// changed them. Either digest is the SHA-1 of the sorted, distinct ids
// joined by "-"; a file that does not exist adds nothing, and when none
// does the key is "default" (after the prefix, if any).

// BlobIDFS is a file system that knows the git blob id of its files, as a
// commit's tree does. FilesCacheKey hashes the contents of the files of
// any other file system as git would.
type BlobIDFS interface {
	fs.FS
	// BlobID returns the blob id of the regular file name, false when
	// name is not one.
	BlobID(name string) (string, bool)
}

// CacheKeyDigest is GitLab's digest of blob or commit ids: the SHA-1 of
// the sorted distinct non-empty ids joined by "-", "" when there are none.
func CacheKeyDigest(ids []string) string {
	ids = slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == "" })
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	sum := sha1.Sum([]byte(strings.Join(ids, "-")))
	return hex.EncodeToString(sum[:])
}

// cacheKeyPattern is GitLab's reading of a cache:key:files pattern (its
// Repository#search_files_by_wildcard_path): "**" matches anything, "*"
// anything but "/", every other character itself, and the pattern the
// whole path. So "**/package.json" matches every package.json below the
// root but not the root's own.
func cacheKeyPattern(p string) *regexp.Regexp {
	q := regexp.QuoteMeta(p)
	q = strings.ReplaceAll(q, `\*\*`, `.*?`)
	q = strings.ReplaceAll(q, `\*`, `[^/]*?`)
	return regexp.MustCompile("^" + q + "$")
}

// ExpandCacheKeyFiles returns the paths that the cache:key:files (or
// files_commits) entries name in fsys, sorted and distinct: an entry
// without "*" as written (a leading "/" dropped, the repository's root
// being the only one there is), one with "*" every regular file of fsys
// it matches. Whether the written paths exist is left to the caller.
// Directories named .git are not searched (a work tree's repository).
func ExpandCacheKeyFiles(fsys fs.FS, entries []string) ([]string, error) {
	var paths []string
	var patterns []*regexp.Regexp
	for _, e := range entries {
		e = strings.TrimLeft(e, "/")
		switch {
		case e == "":
		case strings.Contains(e, "*"):
			patterns = append(patterns, cacheKeyPattern(e))
		default:
			paths = append(paths, e)
		}
	}
	if len(patterns) > 0 {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == ".git" && p != "." {
					return fs.SkipDir
				}
				return nil
			}
			for _, re := range patterns {
				if re.MatchString(p) {
					paths = append(paths, p)
					break
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing files for the cache key: %w", err)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths), nil
}

// FilesCacheKey computes the cache:key:files digest of entries over fsys
// (see CacheKeyDigest); "" when none of the files exists.
func FilesCacheKey(fsys fs.FS, entries []string) (string, error) {
	paths, err := ExpandCacheKeyFiles(fsys, entries)
	if err != nil {
		return "", err
	}
	known, _ := fsys.(BlobIDFS)
	var ids []string
	for _, p := range paths {
		if !fs.ValidPath(p) {
			continue // such as "a/../b": no file of a tree has that name
		}
		if known != nil {
			if id, ok := known.BlobID(p); ok {
				ids = append(ids, id)
			}
			continue
		}
		st, err := fs.Stat(fsys, p)
		if errors.Is(err, fs.ErrNotExist) || err == nil && !st.Mode().IsRegular() {
			continue // a tree has no blob of that name
		}
		var b []byte
		if err == nil {
			b, err = fs.ReadFile(fsys, p)
		}
		if err != nil {
			return "", fmt.Errorf("reading %s for the cache key: %w", p, err)
		}
		ids = append(ids, GitBlobID(b))
	}
	return CacheKeyDigest(ids), nil
}

// CommitsCacheKey computes the cache:key:files_commits digest of entries
// (patterns expanded over fsys) from last, which returns the last commit
// that changed a path ("" for none); "" when no file has one.
func CommitsCacheKey(ctx context.Context, fsys fs.FS, entries []string,
	last func(ctx context.Context, path string) (string, error)) (string, error) {
	paths, err := ExpandCacheKeyFiles(fsys, entries)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, p := range paths {
		if !fs.ValidPath(p) {
			continue
		}
		id, err := last(ctx, p)
		if err != nil {
			return "", err
		}
		ids = append(ids, id)
	}
	return CacheKeyDigest(ids), nil
}

// FSCacheKey is the CacheKeyFunc of the files of fsys (a commit's tree,
// or a work tree): cache:key:files from their contents (FilesCacheKey),
// files_commits from last, the last commit that changed a path ("" for
// none; nil: no commits known, the key is "default").
func FSCacheKey(fsys fs.FS, last func(ctx context.Context, path string) (string, error)) CacheKeyFunc {
	return func(ctx context.Context, files []string, commits bool) (string, error) {
		switch {
		case !commits:
			return FilesCacheKey(fsys, files)
		case last == nil:
			return "", nil
		}
		return CommitsCacheKey(ctx, fsys, files, last)
	}
}

// GitBlobID is the id git gives a blob of content b.
func GitBlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}
