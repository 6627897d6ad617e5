package main

import (
	"context"
	"io/fs"
	"os/exec"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/gitrepo"
)

// lintGit reads the repository the linted file is in, when it is in one
// and git is installed: the commit under lint (HEAD) and diffs for
// rules:changes.
type lintGit struct {
	repo *gitrepo.Repo // nil outside a work tree
	head string        // HEAD's sha
	// mrTarget is a merge request pipeline's target branch: its changes
	// are against it, as GitLab's.
	mrTarget string
	mu       sync.Mutex
	diffs    map[string][]string // compare_to → changed files; nil: unknown
}

// openLintGit finds root's work tree and its HEAD commit (nil outside one).
func openLintGit(ctx context.Context, root string) (*lintGit, *gitrepo.Commit) {
	g := &lintGit{}
	repo, err := gitrepo.OpenWorkTree(ctx, root)
	if err != nil {
		return g, nil
	}
	sha, err := repo.ResolveCommit(ctx, "HEAD")
	if err != nil {
		return g, nil // no commit yet
	}
	c, err := repo.Commit(ctx, sha)
	if err != nil {
		return g, nil
	}
	g.repo, g.head = repo, sha
	return g, c
}

// commitVars are the CI_COMMIT_* variables of c (a placeholder commit
// when nil), as the coordinator sets them.
func commitVars(c *gitrepo.Commit, pre map[string]string) {
	if c == nil {
		c = &gitrepo.Commit{Sha: gitrepo.ZeroSha}
	}
	pre["CI_COMMIT_SHA"] = c.Sha
	pre["CI_COMMIT_SHORT_SHA"] = dispatch.ShortSha(c.Sha)
	pre["CI_COMMIT_BEFORE_SHA"] = gitrepo.ZeroSha
	pre["CI_COMMIT_MESSAGE"] = c.Message
	pre["CI_COMMIT_TITLE"] = c.Title()
	pre["CI_COMMIT_DESCRIPTION"] = c.Description()
	if c.AuthorName != "" {
		pre["CI_COMMIT_AUTHOR"] = c.AuthorName + " <" + c.AuthorEmail + ">"
		pre["CI_COMMIT_TIMESTAMP"] = c.AuthorDate
	}
}

// changes answers rules:changes: with compare_to (in a merge request
// pipeline, its target branch by default), the files changed between the
// merge base of compare_to and HEAD, and HEAD, when both are in the work
// tree's repository (compare_to also as origin/NAME); any other clause is
// true, as GitLab's for a pipeline with no push before.
func (g *lintGit) changes(ctx context.Context, q ci.ChangesQuery) (bool, error) {
	if q.CompareTo == "" {
		q.CompareTo = g.mrTarget
	}
	if q.CompareTo == "" || g.repo == nil {
		return true, nil
	}
	files, known := g.changed(ctx, q.CompareTo)
	if !known {
		return true, nil // not in this clone: unknown, so as without a diff
	}
	return ci.ChangesMatch(q.Paths, files), nil
}

// changed lists the files changed between the merge base of ref and HEAD,
// and HEAD, once per ref (a large configuration asks for every clause).
func (g *lintGit) changed(ctx context.Context, ref string) ([]string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if files, ok := g.diffs[ref]; ok {
		return files, files != nil
	}
	if g.diffs == nil {
		g.diffs = map[string][]string{}
	}
	g.diffs[ref] = nil
	for _, r := range []string{ref, "origin/" + strings.TrimPrefix(ref, "refs/heads/")} {
		base, err := g.repo.ResolveCommit(ctx, r)
		if err != nil {
			continue
		}
		if mb, err := g.repo.MergeBase(ctx, base, g.head); err == nil {
			base = mb
		}
		files, err := g.repo.ChangedFiles(ctx, base, g.head)
		if err != nil {
			return nil, false
		}
		g.diffs[ref] = append([]string{}, files...)
		return g.diffs[ref], true
	}
	return nil, false
}

// selfComponents resolves include:component addresses of the linted
// project itself at the commit under lint ($CI_SERVER_FQDN/
// $CI_PROJECT_PATH/NAME@$CI_COMMIT_SHA, GitLab's way to test a component
// in its own project) from the root's templates/ directory, and passes
// every other include to the mirror.
type selfComponents struct {
	*ci.DirResolver
	root         fs.FS
	hosts        []string // CI_SERVER_FQDN and CI_SERVER_HOST
	project, sha string
	ref          string
}

func (r selfComponents) Component(ctx context.Context, ref ci.ComponentRef) (*ci.IncludedFile, error) {
	self := ref.Project == r.project && (ref.Version == r.sha || ref.Version == r.ref)
	own := false
	for _, h := range r.hosts {
		own = own || strings.EqualFold(ref.Host, h)
	}
	if self && own {
		for _, f := range ci.ComponentFiles(ref.Name) {
			if _, err := fs.Stat(r.root, f); err == nil {
				return &ci.IncludedFile{Tree: r.root, TreeName: ref.Host + "/" + r.project + "@" + ref.Version + ":", SHA: r.sha}, nil
			}
		}
	}
	return r.DirResolver.Component(ctx, ref)
}

// trackedFS is a work tree as a commit of it would hold it: only the files
// git tracks (staged ones included) are there, untracked and ignored ones
// (build output, caches, editors' files) are not, so that patterns such as
// cache:key:files' "**/*.lock" match what GitLab's would in the commit.
type trackedFS struct {
	fsys  fs.FS
	files map[string]bool // tracked files
	dirs  map[string]bool // their directories, "." included
}

// trackedFiles is fsys (the work tree at root) limited to git's tracked
// files; fsys itself when git cannot say (not a work tree, no git).
func trackedFiles(ctx context.Context, root string, fsys fs.FS) fs.FS {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "ls-files", "-z", "--cached").Output()
	if err != nil {
		return fsys
	}
	t := &trackedFS{fsys: fsys, files: map[string]bool{}, dirs: map[string]bool{".": true}}
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" || !fs.ValidPath(f) {
			continue
		}
		t.files[f] = true
		for d := path.Dir(f); d != "." && !t.dirs[d]; d = path.Dir(d) {
			t.dirs[d] = true
		}
	}
	return t
}

func (t *trackedFS) Open(name string) (fs.File, error) {
	if !t.files[name] && !t.dirs[name] {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return t.fsys.Open(name)
}

func (t *trackedFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if !t.dirs[name] {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	entries, err := fs.ReadDir(t.fsys, name)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(entries, func(e fs.DirEntry) bool {
		p := path.Join(name, e.Name())
		return !t.files[p] && !t.dirs[p]
	}), nil
}
