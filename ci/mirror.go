package ci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"sort"
	"strings"
	"sync"
)

// DirResolver is an IncludeResolver that reads included files from a
// local mirror directory, for offline use (berth ci lint --include-dir):
//
//	DIR/remote/HOST/PATH                 include:remote https://HOST/PATH (port kept as HOST:PORT, query ignored)
//	DIR/templates/NAME                   include:template NAME (a copy of GitLab's lib/gitlab/ci/templates)
//	DIR/projects/GROUP/PROJECT@REF/FILE  include:project with ref: REF
//	DIR/projects/GROUP/PROJECT/FILE      include:project at any ref without a directory of its own
//	DIR/projects/GROUP/PROJECT@VERSION/templates/NAME.yml   include:component HOST/GROUP/PROJECT/NAME@VERSION
//	DIR/projects/GROUP/PROJECT/templates/NAME[/template.yml] components of any version without one
//
// For a component version ~latest or 1 / 1.2, the PROJECT@TAG directories
// are the releases it chooses from. A file the mirror does not hold is
// ErrIncludeUnavailable: DirResolver records it (Unresolved) with where to
// put it, and the compilation goes on without it. A DirResolver is safe
// for concurrent use.
type DirResolver struct {
	fsys fs.FS  // nil: no mirror, every include is unavailable
	name string // the directory as the user wrote it, for positions and hints

	mu     sync.Mutex
	misses map[string]UnresolvedInclude
}

// UnresolvedInclude is an include a DirResolver could not supply.
type UnresolvedInclude struct {
	Kind    string `json:"kind"`    // project, remote, template, component
	Include string `json:"include"` // the include as written (variables expanded)
	// Hint says where the mirror should hold the file.
	Hint string `json:"hint"`
}

// NewDirResolver reads from fsys, a mirror directory the user knows as
// name. fsys may be nil (no mirror): every include is then unresolved.
func NewDirResolver(fsys fs.FS, name string) *DirResolver {
	if name == "" {
		name = "DIR"
	}
	return &DirResolver{fsys: fsys, name: strings.TrimSuffix(name, "/"), misses: map[string]UnresolvedInclude{}}
}

// Unresolved lists the includes the mirror did not hold, each once,
// sorted.
func (d *DirResolver) Unresolved() []UnresolvedInclude {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]UnresolvedInclude, 0, len(d.misses))
	for _, u := range d.misses {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Include < out[j].Include
	})
	return out
}

func (d *DirResolver) miss(kind, include, where string) error {
	hint := "put it at " + d.name + "/" + where
	if d.fsys == nil {
		hint = "no include directory was given; supply one holding it at DIR/" + where
	}
	d.mu.Lock()
	d.misses[kind+"\x00"+include] = UnresolvedInclude{Kind: kind, Include: include, Hint: hint}
	d.mu.Unlock()
	return fmt.Errorf("include:%s %s: %w (%s)", kind, include, ErrIncludeUnavailable, hint)
}

func (d *DirResolver) file(p string) ([]byte, bool, error) {
	if d.fsys == nil || !fs.ValidPath(p) {
		return nil, false, nil
	}
	st, err := fs.Stat(d.fsys, p)
	if errors.Is(err, fs.ErrNotExist) || err == nil && st.IsDir() {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	b, err := fs.ReadFile(d.fsys, p)
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

func (d *DirResolver) dirExists(p string) bool {
	if d.fsys == nil || !fs.ValidPath(p) {
		return false
	}
	st, err := fs.Stat(d.fsys, p)
	return err == nil && st.IsDir()
}

// Remote reads DIR/remote/HOST/PATH.
func (d *DirResolver) Remote(ctx context.Context, rawURL string, _ RemoteOptions) (*IncludedFile, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, IncludeErrorf("Remote file `%s` does not have a valid address!", rawURL)
	}
	p := path.Join("remote", u.Host, path.Clean("/"+u.Path))
	b, ok, err := d.file(p)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, d.miss("remote", rawURL, p)
	}
	return &IncludedFile{Data: b, Location: d.name + "/" + p}, nil
}

// Template reads DIR/templates/NAME.
func (d *DirResolver) Template(ctx context.Context, name string) (*IncludedFile, error) {
	p := path.Join("templates", name)
	b, ok, err := d.file(p)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, d.miss("template", name, p)
	}
	return &IncludedFile{Data: b, Location: d.name + "/" + p}, nil
}

// projectDir is DIR/projects/PROJECT@REF when it exists, else
// DIR/projects/PROJECT.
func (d *DirResolver) projectDir(project, ref string) string {
	if ref != "" {
		if p := path.Join("projects", project+"@"+ref); d.dirExists(p) {
			return p
		}
	}
	return path.Join("projects", project)
}

// Project reads FILE from the project's directory.
func (d *DirResolver) Project(ctx context.Context, project, ref, file string) (*IncludedFile, error) {
	dir := d.projectDir(project, ref)
	p := path.Join(dir, file)
	b, ok, err := d.file(p)
	if err != nil {
		return nil, err
	}
	if !ok {
		name := project + ":" + file
		if ref != "" {
			name += "@" + ref
		}
		return nil, d.miss("project", name, p)
	}
	sub, err := fs.Sub(d.fsys, dir)
	if err != nil {
		return nil, err
	}
	return &IncludedFile{Data: b, Location: d.name + "/" + p, Tree: sub, TreeName: d.name + "/" + dir + "/"}, nil
}

// ExistsIn answers rules:exists with project from the project's directory
// (DIR/projects/PROJECT@REF, else DIR/projects/PROJECT): whether one of
// its files matches a pattern. A project the mirror does not hold is
// recorded as unresolved, and its rule does not match (as when GitLab's
// user may not read it).
func (d *DirResolver) ExistsIn(ctx context.Context, project, ref string, patterns []string) (bool, error) {
	dir := d.projectDir(project, ref)
	if !d.dirExists(dir) {
		name := project
		if ref != "" {
			name += "@" + ref
		}
		_ = d.miss("project", name+" (rules:exists)", dir+"/")
		return false, nil
	}
	sub, err := fs.Sub(d.fsys, dir)
	if err != nil {
		return false, err
	}
	return FSExists(sub)(ctx, patterns)
}

// Component returns the component project's directory for the version.
func (d *DirResolver) Component(ctx context.Context, ref ComponentRef) (*IncludedFile, error) {
	version := ref.Version
	if IsVersionPattern(version) && d.fsys != nil {
		var tags []string
		parent := path.Dir(path.Join("projects", ref.Project))
		prefix := path.Base(ref.Project) + "@"
		if des, err := fs.ReadDir(d.fsys, parent); err == nil {
			for _, de := range des {
				if de.IsDir() && strings.HasPrefix(de.Name(), prefix) {
					tags = append(tags, strings.TrimPrefix(de.Name(), prefix))
				}
			}
		}
		if t, ok := ResolveComponentVersion(version, tags); ok {
			version = t
		}
	}
	dir := d.projectDir(ref.Project, version)
	for _, f := range ComponentFiles(ref.Name) {
		if _, ok, err := d.file(path.Join(dir, f)); err != nil {
			return nil, err
		} else if ok {
			sub, err := fs.Sub(d.fsys, dir)
			if err != nil {
				return nil, err
			}
			// The mirror holds no commits: a version that is a commit
			// SHA is its own sha, any other has none here.
			sha := ""
			if isCommitSHA(version) {
				sha = version
			}
			return &IncludedFile{Tree: sub, TreeName: d.name + "/" + dir + "/", SHA: sha, Version: ReleasedVersion(version)}, nil
		}
	}
	v := ref.Version
	if IsVersionPattern(v) {
		v = "RELEASE_TAG"
	}
	return nil, d.miss("component", ref.Address, path.Join("projects", ref.Project+"@"+v, ComponentFiles(ref.Name)[0]))
}
