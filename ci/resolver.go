package ci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// IncludeResolver supplies the included files that are not in the
// pipeline's own repository: include:project, include:remote,
// include:template and include:component. Compile calls it while loading
// the configuration, at most once per distinct request, from one
// goroutine; an implementation shared by concurrent compilations must be
// safe for concurrent use.
//
// Every method returns one of:
//
//   - the file (or, for Component, the project tree it lives in);
//   - an error wrapping *IncludeError: the include is wrong (no such
//     project, file or ref, access denied, fetch failed, too large). It
//     becomes a configuration error at the include, with the message;
//   - an error wrapping ErrIncludeUnavailable: nothing here can supply the
//     file (berth ci lint without a mirror entry). The pipeline is compiled
//     without it and, as for a failed include, problems the file could
//     explain (a missing extends target, stage, needed job) are not
//     reported. The resolver itself tells the user which include it could
//     not supply: Compile does not;
//   - any other error: the compilation cannot go on (I/O, context); Compile
//     returns it as is.
type IncludeResolver interface {
	// Project returns file (a path inside the project, no leading slash)
	// of the project with the full path project at ref; an empty ref means
	// the project's default branch. Tree of the result is that project at
	// the commit read, for the file's own local includes.
	Project(ctx context.Context, project, ref, file string) (*IncludedFile, error)
	// Remote returns the body of a GET of url (http or https). Compile
	// checks opts.Integrity itself; a resolver that caches may use it and
	// opts.CacheTTL to decide whether a cached body will do.
	Remote(ctx context.Context, url string, opts RemoteOptions) (*IncludedFile, error)
	// Template returns GitLab's CI template name (for example
	// "Jobs/Build.gitlab-ci.yml").
	Template(ctx context.Context, name string) (*IncludedFile, error)
	// Component returns the tree of the component's project at the
	// version asked for (see ResolveComponentVersion): Compile reads
	// templates/NAME.yml or templates/NAME/template.yml from it. Data of
	// the result is unused.
	Component(ctx context.Context, ref ComponentRef) (*IncludedFile, error)
}

// IncludedFile is a file an IncludeResolver supplied.
type IncludedFile struct {
	// Data is the file's content.
	Data []byte
	// Location names the file in error positions (file:line:col), for
	// example "group/project@main:ci/build.yml", a URL, or
	// "templates/Jobs/Build.gitlab-ci.yml".
	Location string
	// Tree, for files of a project (Project and Component), is that
	// project's files at the commit the file came from: include:local
	// inside the file reads from it, as GitLab reads them relative to the
	// included file's project. Nil for remote and template files, which
	// have no project to read local files from.
	Tree fs.FS
	// TreeName prefixes the paths of Tree's files in positions, for
	// example "group/project@main:".
	TreeName string
	// SHA is the commit Tree is (Project and Component), when known.
	SHA string
	// Version, for a component, is the released version the address
	// resolved to ("1.2.3" for @1.2.3, @1.2, @1 or @~latest); empty when
	// it names a commit or a branch.
	Version string
}

// RemoteOptions are the include:remote settings a resolver may use.
type RemoteOptions struct {
	// Integrity is the include's integrity ("sha256-BASE64"), empty if
	// none.
	Integrity string
	// CacheTTL is how old a cached body may be (include:remote:cache:
	// true is one hour); zero means the include did not ask for caching.
	CacheTTL time.Duration
}

// ComponentRef is a parsed include:component address,
// HOST/GROUP/PROJECT/NAME@VERSION: the last slash separates the project's
// full path from the component name, as in GitLab.
type ComponentRef struct {
	Address string // as written, variables expanded
	Host    string // the server, for example "gitlab.example.com:8443"
	Project string // the project's full path
	Name    string // the component's name
	Version string // a tag, branch, commit SHA, "~latest", or "1" / "1.2"
}

// ErrIncludeUnavailable is wrapped by a resolver that cannot supply a file
// here (see IncludeResolver).
var ErrIncludeUnavailable = errors.New("include not available here")

// IncludeError is an include that cannot be resolved because of the
// configuration: its message is shown to the user at the include.
type IncludeError struct {
	Msg string
}

func (e *IncludeError) Error() string { return e.Msg }

// IncludeErrorf returns an *IncludeError with a formatted message.
func IncludeErrorf(format string, args ...any) error {
	return &IncludeError{Msg: fmt.Sprintf(format, args...)}
}

// ParseComponent parses an include:component address.
func ParseComponent(addr string) (ComponentRef, error) {
	full, version, ok := strings.Cut(addr, "@")
	if !ok || version == "" {
		return ComponentRef{}, fmt.Errorf("component address %q needs a version: HOST/PROJECT/NAME@VERSION", addr)
	}
	host, rest, ok := strings.Cut(full, "/")
	i := strings.LastIndex(rest, "/")
	if !ok || host == "" || i <= 0 || i == len(rest)-1 || strings.HasPrefix(rest, "/") || strings.Contains(rest, "//") {
		return ComponentRef{}, fmt.Errorf("component address %q: want HOST/GROUP/PROJECT/NAME@VERSION", addr)
	}
	r := ComponentRef{Address: addr, Host: host, Project: rest[:i], Name: rest[i+1:], Version: version}
	for _, part := range strings.Split(r.Project+"/"+r.Name, "/") {
		if part == "." || part == ".." {
			return ComponentRef{}, fmt.Errorf("component address %q: . and .. are not path components", addr)
		}
	}
	return r, nil
}

// ComponentFiles are the places a component's file may be, in the order
// GitLab looks: templates/NAME.yml, then templates/NAME/template.yml.
func ComponentFiles(name string) []string {
	return []string{"templates/" + name + ".yml", "templates/" + name + "/template.yml"}
}

// LatestVersion is the component version that means the highest release.
const LatestVersion = "~latest"

var (
	shortSemverRe = regexp.MustCompile(`^\d+(\.\d+)?$`)
	semverRe      = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$`)
)

// IsVersionPattern reports whether a component version is ~latest or a
// partial semantic version ("1", "1.2"): one ResolveComponentVersion
// answers from the project's tags, not a ref to look up as written.
func IsVersionPattern(v string) bool {
	return v == LatestVersion || shortSemverRe.MatchString(v)
}

// ReleasedVersion is $[[ component.version ]] for a component read at ref
// (after ResolveComponentVersion): ref when it is a release (a full
// semantic version, "1.2.3" or "v1.2.3"), else "" (a commit or a branch).
func ReleasedVersion(ref string) string {
	if semverRe.MatchString(ref) {
		return ref
	}
	return ""
}

// isCommitSHA reports whether a component version is a full commit SHA.
func isCommitSHA(v string) bool {
	if len(v) != 40 && len(v) != 64 {
		return false
	}
	for _, r := range v {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// ResolveComponentVersion picks the tag a version pattern means among a
// project's tags: for "~latest" the highest semantic-version tag that is
// not a pre-release, for "1" or "1.2" the highest such tag with that major
// (and minor) version. Tags that are not semantic versions (an optional
// leading v allowed) are ignored. ok is false when no tag matches.
func ResolveComponentVersion(version string, tags []string) (tag string, ok bool) {
	if !IsVersionPattern(version) {
		return "", false
	}
	var want []int
	if version != LatestVersion {
		for _, p := range strings.Split(version, ".") {
			n, err := strconv.Atoi(p)
			if err != nil {
				return "", false
			}
			want = append(want, n)
		}
	}
	type cand struct {
		tag string
		v   [3]int
	}
	var cs []cand
	for _, t := range tags {
		m := semverRe.FindStringSubmatch(t)
		if m == nil || m[4] != "" {
			continue
		}
		var v [3]int
		bad := false
		for i := 0; i < 3; i++ {
			n, err := strconv.Atoi(m[i+1])
			if err != nil {
				bad = true
			}
			v[i] = n
		}
		if bad {
			continue
		}
		match := true
		for i, w := range want {
			if v[i] != w {
				match = false
			}
		}
		if match {
			cs = append(cs, cand{t, v})
		}
	}
	if len(cs) == 0 {
		return "", false
	}
	sort.Slice(cs, func(i, j int) bool {
		a, b := cs[i].v, cs[j].v
		if a != b {
			for k := 0; k < 3; k++ {
				if a[k] != b[k] {
					return a[k] > b[k]
				}
			}
		}
		return cs[i].tag < cs[j].tag // 1.0.0 before v1.0.0
	})
	return cs[0].tag, true
}
