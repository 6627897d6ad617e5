package main

import (
	"bytes"
	"context"
	"io/fs"
	"os/exec"
	"strings"
	"sync"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/gitrepo"
)

// zeroSha is the commit berth ci lint uses outside a git work tree, and
// CI_COMMIT_BEFORE_SHA (as GitLab's for a pipeline with no push before).
const zeroSha = "0000000000000000000000000000000000000000"

// lintGit reads the repository the linted file is in, when it is in one
// and git is installed: the commit under lint (HEAD) and diffs for
// rules:changes:compare_to.
type lintGit struct {
	root string
	// mrTarget is a merge request pipeline's target branch: its changes
	// are against it, as GitLab's.
	mrTarget string
	// noRepo: head found no work tree (or no git), so nothing is asked.
	noRepo bool
	mu     sync.Mutex
	diffs  map[string][]string // compare_to → changed files; nil: unknown
}

func (g *lintGit) run(ctx context.Context, args ...string) (string, bool) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", g.root}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	if cmd.Run() != nil {
		return "", false
	}
	return out.String(), true
}

// head is the HEAD commit, nil outside a work tree (or without git).
func (g *lintGit) head(ctx context.Context) *gitrepo.Commit {
	out, ok := g.run(ctx, "log", "-1", "--format=%H%x00%an%x00%ae%x00%aI%x00%B")
	if !ok {
		g.noRepo = true
		return nil
	}
	f := strings.SplitN(out, "\x00", 5)
	if len(f) != 5 || len(f[0]) < 40 {
		return nil
	}
	return &gitrepo.Commit{Sha: f[0], AuthorName: f[1], AuthorEmail: f[2], AuthorDate: f[3], Message: strings.TrimRight(f[4], "\n")}
}

// commitVars are the CI_COMMIT_* variables of c (a placeholder commit
// when nil), as the coordinator sets them.
func commitVars(c *gitrepo.Commit, pre map[string]string) {
	if c == nil {
		c = &gitrepo.Commit{Sha: zeroSha}
	}
	pre["CI_COMMIT_SHA"] = c.Sha
	pre["CI_COMMIT_SHORT_SHA"] = dispatch.ShortSha(c.Sha)
	pre["CI_COMMIT_BEFORE_SHA"] = zeroSha
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
	if q.CompareTo == "" || g.noRepo {
		return true, nil
	}
	files, known := g.changed(ctx, q.CompareTo)
	if !known {
		return true, nil // not in this clone: unknown, so as without a diff
	}
	for _, f := range files {
		for _, p := range q.Paths {
			if ci.MatchGlob(strings.TrimPrefix(p, "/"), f) {
				return true, nil
			}
		}
	}
	return false, nil
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
	var base string
	for _, r := range []string{ref, "origin/" + strings.TrimPrefix(ref, "refs/heads/")} {
		if out, ok := g.run(ctx, "merge-base", r, "HEAD"); ok {
			base = strings.TrimSpace(out)
			break
		}
	}
	if base == "" {
		return nil, false
	}
	out, ok := g.run(ctx, "diff", "--name-only", "-z", base, "HEAD")
	if !ok {
		return nil, false
	}
	files := []string{}
	for _, f := range strings.Split(out, "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	g.diffs[ref] = files
	return files, true
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
				return &ci.IncludedFile{Tree: r.root, TreeName: ref.Host + "/" + r.project + "@" + ref.Version + ":"}, nil
			}
		}
	}
	return r.DirResolver.Component(ctx, ref)
}
