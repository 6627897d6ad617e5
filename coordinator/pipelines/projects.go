package pipelines

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
)

// ParseProjectPath checks a project's full path ("group/sub/name") the
// way GitLab names paths (githost.ParseProjectPath): segments of letters,
// digits, '_', '-' and '.', not starting with '-' or '.', not ending with
// '.', '.git' or '.atom'. It returns the path without surrounding slashes;
// its errors wrap ErrInvalid.
func ParseProjectPath(p string) (string, error) {
	clean, err := githost.ParseProjectPath(p)
	if err != nil {
		return "", fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return clean, nil
}

// ProjectSpec is what CreateProject takes.
type ProjectSpec struct {
	// Path is the full path, "name" or "group/sub/name".
	Path          string
	Name          string // default: the last segment of Path
	Description   string
	DefaultBranch string // default main
	// Visibility is private (default) or public; see docs/pipelines.md.
	Visibility string
	// MinIsolation is the weakest isolation level the project's jobs run
	// at (none, cgroups, container, microvm, vm, instance; empty: none);
	// see docs/isolation.md.
	MinIsolation string
}

// checkVisibility normalizes a project visibility.
func checkVisibility(v string) (string, error) {
	switch v {
	case "":
		return "private", nil
	case "private", "public":
		return v, nil
	case "internal":
		return "private", nil // Berth has no users to be internal to
	}
	return "", fmt.Errorf("visibility %q: want private or public: %w", v, ErrInvalid)
}

// checkMinIsolation normalizes a project's minimum isolation level ("" and
// none are stored as "").
func checkMinIsolation(s string) (string, error) {
	l, err := dispatch.ParseIsolation(s)
	if err != nil {
		return "", fmt.Errorf("min_isolation %q: want one of %s: %w", s, dispatch.IsolationNames, ErrInvalid)
	}
	if l == executor.IsolationNone {
		l = ""
	}
	return string(l), nil
}

// CreateProject creates a project and its empty bare repository.
// ErrExists if the path is taken, ErrInvalid for a bad path.
func (s *Engine) CreateProject(ctx context.Context, spec ProjectSpec) (*store.Project, error) {
	if s.git.Dir() == "" {
		return nil, ErrGitDisabled
	}
	p, err := ParseProjectPath(spec.Path)
	if err != nil {
		return nil, err
	}
	if spec.Visibility, err = checkVisibility(spec.Visibility); err != nil {
		return nil, err
	}
	if spec.MinIsolation, err = checkMinIsolation(spec.MinIsolation); err != nil {
		return nil, err
	}
	if spec.DefaultBranch == "" {
		spec.DefaultBranch = "main"
	}
	if !validRefName(spec.DefaultBranch) {
		return nil, fmt.Errorf("default branch %q is not a valid branch name: %w", spec.DefaultBranch, ErrInvalid)
	}
	if spec.Name == "" {
		spec.Name = p[strings.LastIndex(p, "/")+1:]
	}
	proj := &store.Project{Path: p, Name: spec.Name, Description: spec.Description, DefaultBranch: spec.DefaultBranch,
		Visibility: spec.Visibility, MinIsolation: spec.MinIsolation, CreatedAt: s.clock.Now().UTC()}
	if err := s.store.CreateProject(ctx, proj); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, fmt.Errorf("project %q: %w", p, ErrExists)
		}
		return nil, err
	}
	s.dispatch.SetProjectMinimum(proj.ID, executor.Isolation(proj.MinIsolation))
	if _, err := gitrepo.Init(ctx, s.git.RepoPath(proj.ID), proj.DefaultBranch); err != nil {
		return nil, fmt.Errorf("creating the repository of project %q: %w", p, err)
	}
	s.log.Info("project created", "project_id", proj.ID, "path", p)
	return proj, nil
}

// ProjectUpdate is what UpdateProject changes: nil fields are left alone.
// The path and the default branch (the repository's HEAD) stay as created.
type ProjectUpdate struct {
	Name        *string
	Description *string
	Visibility  *string
	// MinIsolation: "" or none removes the minimum. A change applies to
	// the project's jobs still in the queue at once.
	MinIsolation *string
}

// UpdateProject changes a project's settings. ErrNotFound if it does not
// exist, ErrInvalid for a bad value.
func (s *Engine) UpdateProject(ctx context.Context, id int64, u ProjectUpdate) (*store.Project, error) {
	p, err := s.store.GetProject(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("project %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if u.Name != nil {
		if strings.TrimSpace(*u.Name) == "" {
			return nil, fmt.Errorf("name is empty: %w", ErrInvalid)
		}
		p.Name = *u.Name
	}
	if u.Description != nil {
		p.Description = *u.Description
	}
	if u.Visibility != nil {
		if p.Visibility, err = checkVisibility(*u.Visibility); err != nil {
			return nil, err
		}
	}
	if u.MinIsolation != nil {
		if p.MinIsolation, err = checkMinIsolation(*u.MinIsolation); err != nil {
			return nil, err
		}
	}
	if err := s.store.UpdateProject(ctx, p); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("project %d: %w", id, ErrNotFound)
		}
		return nil, err
	}
	s.dispatch.SetProjectMinimum(p.ID, executor.Isolation(p.MinIsolation))
	s.log.Info("project updated", "project_id", p.ID, "min_isolation", p.MinIsolation)
	return p, nil
}

// Project finds a project by id ("12") or full path ("group/demo");
// ErrNotFound if there is none.
func (s *Engine) Project(ctx context.Context, idOrPath string) (*store.Project, error) {
	var (
		p   *store.Project
		err error
	)
	if id, perr := strconv.ParseInt(idOrPath, 10, 64); perr == nil {
		p, err = s.store.GetProject(ctx, id)
	} else {
		p, err = s.store.ProjectByPath(ctx, strings.Trim(idOrPath, "/"))
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("project %q: %w", idOrPath, ErrNotFound)
	}
	return p, err
}

// CommitDir commits the files of dir onto branch of the project's
// repository without going through HTTP (for in-process use such as
// berth run), and returns the commit. No commit is made when nothing
// changed; the branch's commit is returned then. No pipeline is created:
// call CreatePipeline.
func (s *Engine) CommitDir(ctx context.Context, projectID int64, branch, dir, message string) (string, error) {
	return s.CommitDirAs(ctx, projectID, branch, dir, message, gitrepo.Author{})
}

// CommitDirAs is CommitDir as author (gitrepo.CommitDir).
func (s *Engine) CommitDirAs(ctx context.Context, projectID int64, branch, dir, message string, author gitrepo.Author) (string, error) {
	p, err := s.store.GetProject(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("project %d: %w", projectID, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	if branch == "" {
		branch = p.DefaultBranch
	}
	if !validRefName(branch) {
		return "", fmt.Errorf("branch %q: %w", branch, ErrInvalid)
	}
	r, err := s.git.Repo(ctx, p)
	if err != nil {
		return "", err
	}
	lock := s.git.RepoLock(p.ID)
	lock.Lock()
	defer lock.Unlock()
	sha, _, err := gitrepo.CommitDir(ctx, r.Dir, dir, branch, message, author)
	return sha, err
}

// validRefName checks a branch or tag name (without refs/heads/) against
// git's rules (git check-ref-format), without running git.
func validRefName(name string) bool {
	if name == "" || len(name) > 255 || name == "@" || strings.HasPrefix(name, "-") ||
		strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") || strings.HasSuffix(name, ".") ||
		strings.Contains(name, "..") || strings.Contains(name, "@{") || strings.Contains(name, "//") {
		return false
	}
	for _, seg := range strings.Split(name, "/") {
		if strings.HasPrefix(seg, ".") || strings.HasSuffix(seg, ".lock") {
			return false
		}
	}
	for _, c := range name {
		if c < 0x20 || c == 0x7f || strings.ContainsRune(" ~^:?*[\\", c) {
			return false
		}
	}
	return true
}
