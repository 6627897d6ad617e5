package gitrepo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Author is who CommitDir commits as, and when.
type Author struct {
	Name, Email string
	// DateFor, if set, gives the author and committer date of a commit of
	// tree (zero: now). berth run dates a tree it committed before as it
	// did then, so the same files make the same commit.
	DateFor func(tree string) time.Time
}

// CommitDir commits the files of dir (as `git add -A` sees them, so
// .gitignore applies and .git directories are left out) onto branch of the
// repository at gitDir (bare or not), with the branch's current commit as
// parent. When the tree equals the parent's, no commit is made and the
// parent is returned with created false. The branch update is a
// compare-and-swap: a concurrent update of the branch makes it fail.
func CommitDir(ctx context.Context, gitDir, dir, branch, message string, author Author) (sha string, created bool, err error) {
	if author.Name == "" {
		author.Name, author.Email = "Berth", "berth@localhost"
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return "", false, fmt.Errorf("committing %s: not a directory", dir)
	}
	tmp, err := os.MkdirTemp("", "berth-index-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	ref := "refs/heads/" + branch
	env := []string{
		"GIT_WORK_TREE=" + abs,
		"GIT_INDEX_FILE=" + filepath.Join(tmp, "index"),
		"GIT_AUTHOR_NAME=" + author.Name, "GIT_AUTHOR_EMAIL=" + author.Email,
		"GIT_COMMITTER_NAME=" + author.Name, "GIT_COMMITTER_EMAIL=" + author.Email,
	}
	parent := ""
	if out, err := run(ctx, gitDir, nil, nil, "rev-parse", "--verify", "--quiet", ref+"^{commit}"); err == nil {
		parent = strings.TrimSpace(string(out))
	}
	if _, err := run(ctx, gitDir, env, nil, "-c", "core.bare=false", "add", "--all", "."); err != nil {
		return "", false, fmt.Errorf("adding %s: %w", dir, err)
	}
	out, err := run(ctx, gitDir, env, nil, "-c", "core.bare=false", "write-tree")
	if err != nil {
		return "", false, fmt.Errorf("writing tree of %s: %w", dir, err)
	}
	tree := strings.TrimSpace(string(out))
	if parent != "" {
		if out, err := run(ctx, gitDir, nil, nil, "rev-parse", parent+"^{tree}"); err == nil && strings.TrimSpace(string(out)) == tree {
			return parent, false, nil
		}
	}
	if author.DateFor != nil {
		if d := author.DateFor(tree); !d.IsZero() {
			date := fmt.Sprintf("%d +0000", d.Unix())
			env = append(env, "GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date)
		}
	}
	args := []string{"commit-tree", tree, "-m", message}
	if parent != "" {
		args = append(args, "-p", parent)
	}
	out, err = run(ctx, gitDir, env, nil, args...)
	if err != nil {
		return "", false, fmt.Errorf("committing %s: %w", dir, err)
	}
	sha = strings.TrimSpace(string(out))
	old := parent
	if old == "" {
		old = ZeroSha
	}
	if _, err := run(ctx, gitDir, nil, nil, "update-ref", ref, sha, old); err != nil {
		return "", false, fmt.Errorf("updating %s: %w", ref, err)
	}
	return sha, true, nil
}
