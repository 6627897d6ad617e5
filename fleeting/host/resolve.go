package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Plugin references are resolved the way GitLab Runner does
// (reference/gitlab-protocol.md §7.4):
//
//  1. a path to an existing file;
//  2. a bare name starting with "fleeting-plugin-", looked up in $PATH;
//  3. otherwise an OCI-style reference [registry/][namespace/]name[:constraint]
//     looked up among installed plugins, under $FLEETING_PLUGIN_PATH or
//     ~/.config/fleeting/plugins, in
//     <escaped registry/namespace/name>/<escaped version>/plugin, taking the
//     highest installed version that matches the constraint.
//
// Berth does not download plugins (no registry is reachable from where it
// runs); `gitlab-runner fleeting install` or a copy into the directory does.

// Defaults of an OCI plugin reference.
const (
	DefaultRegistry  = "registry.gitlab.com"
	DefaultNamespace = "gitlab-org/fleeting/plugins"
	// BinaryPrefix starts the file name of every plugin binary.
	BinaryPrefix = "fleeting-plugin-"
)

// ErrPluginNotFound: a reference resolved to nothing.
var ErrPluginNotFound = errors.New("plugin not found")

// Reference is a parsed OCI plugin reference.
type Reference struct {
	Registry   string // e.g. registry.gitlab.com
	Namespace  string // e.g. gitlab-org/fleeting/plugins
	Name       string // e.g. aws
	Constraint string // latest, MAJOR, MAJOR.MINOR or MAJOR.MINOR.PATCH
}

// Repository is registry/namespace/name.
func (r Reference) Repository() string {
	return r.Registry + "/" + r.Namespace + "/" + r.Name
}

func (r Reference) String() string { return r.Repository() + ":" + r.Constraint }

// ParseReference parses [registry/][namespace/]name[:constraint]. The first
// path element is a registry when it looks like a host (contains "." or ":"
// or is "localhost").
func ParseReference(s string) (Reference, error) {
	if s == "" {
		return Reference{}, errors.New("empty plugin reference")
	}
	if strings.ContainsAny(s, " \t\n\\@") {
		return Reference{}, fmt.Errorf("plugin reference %q: invalid character", s)
	}
	ref := Reference{Registry: DefaultRegistry, Namespace: DefaultNamespace, Constraint: "latest"}
	rest := s
	// The constraint follows the last ":" after the last "/".
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		ref.Constraint = rest[i+1:]
		rest = rest[:i]
	}
	if _, err := parseConstraint(ref.Constraint); err != nil {
		return Reference{}, fmt.Errorf("plugin reference %q: %w", s, err)
	}
	parts := strings.Split(rest, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return Reference{}, fmt.Errorf("plugin reference %q: empty or relative path element", s)
		}
	}
	if len(parts) > 1 && (strings.ContainsAny(parts[0], ".:") || parts[0] == "localhost") {
		ref.Registry = parts[0]
		parts = parts[1:]
		if len(parts) == 1 {
			return Reference{}, fmt.Errorf("plugin reference %q: registry without namespace", s)
		}
	}
	ref.Name = parts[len(parts)-1]
	if len(parts) > 1 {
		ref.Namespace = strings.Join(parts[:len(parts)-1], "/")
	}
	return ref, nil
}

// version is MAJOR.MINOR.PATCH[-prerelease].
type version struct {
	major, minor, patch int
	pre                 string
	raw                 string
}

func parseVersion(s string) (version, bool) {
	v := version{raw: s}
	s = strings.TrimPrefix(s, "v")
	if i := strings.IndexByte(s, '+'); i >= 0 {
		s = s[:i]
	}
	if i := strings.IndexByte(s, '-'); i >= 0 {
		v.pre, s = s[i+1:], s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return v, false
	}
	nums := []*int{&v.major, &v.minor, &v.patch}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, false
		}
		*nums[i] = n
	}
	return v, true
}

func (a version) less(b version) bool {
	if a.major != b.major {
		return a.major < b.major
	}
	if a.minor != b.minor {
		return a.minor < b.minor
	}
	if a.patch != b.patch {
		return a.patch < b.patch
	}
	// A release sorts after its prereleases.
	if (a.pre == "") != (b.pre == "") {
		return a.pre != ""
	}
	return a.pre < b.pre
}

// parseConstraint returns the fixed leading numbers of a constraint:
// none for latest, up to three otherwise.
func parseConstraint(c string) ([]int, error) {
	if c == "latest" {
		return nil, nil
	}
	parts := strings.Split(strings.TrimPrefix(c, "v"), ".")
	if len(parts) > 3 {
		return nil, fmt.Errorf("version constraint %q: want latest, MAJOR, MAJOR.MINOR or MAJOR.MINOR.PATCH", c)
	}
	nums := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("version constraint %q: want latest, MAJOR, MAJOR.MINOR or MAJOR.MINOR.PATCH", c)
		}
		nums[i] = n
	}
	return nums, nil
}

func (v version) matches(fixed []int) bool {
	have := []int{v.major, v.minor, v.patch}
	for i, n := range fixed {
		if have[i] != n {
			return false
		}
	}
	// latest and partial constraints skip prereleases; an exact one names
	// its release.
	return v.pre == ""
}

// escapePath escapes a path the way Go module paths are escaped on disk:
// every upper-case letter becomes "!" and its lower-case form.
func escapePath(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			b.WriteRune(r + ('a' - 'A'))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func unescapePath(s string) string {
	var b strings.Builder
	bang := false
	for _, r := range s {
		switch {
		case r == '!':
			bang = true
			continue
		case bang && 'a' <= r && r <= 'z':
			r -= 'a' - 'A'
		}
		bang = false
		b.WriteRune(r)
	}
	return b.String()
}

// InstallDir is where installed plugins live: $FLEETING_PLUGIN_PATH, else
// ~/.config/fleeting/plugins (%APPDATA%\fleeting\plugins on Windows).
func InstallDir() string {
	if d := os.Getenv("FLEETING_PLUGIN_PATH"); d != "" {
		return d
	}
	if runtime.GOOS == "windows" {
		return filepath.Join(os.Getenv("APPDATA"), "fleeting", "plugins")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".config", "fleeting", "plugins")
}

func pluginFile() string {
	if runtime.GOOS == "windows" {
		return "plugin.exe"
	}
	return "plugin"
}

// Resolve finds the executable a plugin reference names; see the rules
// above. installDir is where installed plugins are looked up; "" means
// InstallDir().
func Resolve(ref, installDir string) (string, error) {
	if ref == "" {
		return "", errors.New("no plugin configured")
	}
	if st, err := os.Stat(ref); err == nil && !st.IsDir() {
		return filepath.Abs(ref)
	}
	if strings.ContainsRune(ref, os.PathSeparator) && (filepath.IsAbs(ref) || strings.HasPrefix(ref, ".")) {
		return "", fmt.Errorf("plugin %s: %w", ref, ErrPluginNotFound)
	}
	if strings.HasPrefix(ref, BinaryPrefix) && !strings.ContainsAny(ref, "/:") {
		p, err := execLookPath(ref)
		if err != nil {
			return "", fmt.Errorf("plugin %s: not in PATH: %w", ref, ErrPluginNotFound)
		}
		return p, nil
	}
	r, err := ParseReference(ref)
	if err != nil {
		return "", err
	}
	if installDir == "" {
		installDir = InstallDir()
	}
	versions, err := installedVersions(installDir, r)
	if err != nil {
		return "", err
	}
	fixed, _ := parseConstraint(r.Constraint)
	for i := len(versions) - 1; i >= 0; i-- {
		if versions[i].v.matches(fixed) {
			return versions[i].path, nil
		}
	}
	return "", fmt.Errorf("plugin %s: no installed version matches %s under %s: %w", r.Repository(), r.Constraint, installDir, ErrPluginNotFound)
}

type installed struct {
	v    version
	path string
}

// installedVersions lists the installed versions of r, lowest first.
func installedVersions(dir string, r Reference) ([]installed, error) {
	base := filepath.Join(dir, filepath.FromSlash(escapePath(r.Repository())))
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing installed versions of %s: %w", r.Repository(), err)
	}
	var out []installed
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		v, ok := parseVersion(unescapePath(e.Name()))
		if !ok {
			continue
		}
		p := filepath.Join(base, e.Name(), pluginFile())
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			continue
		}
		out = append(out, installed{v: v, path: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].v.less(out[j].v) })
	return out, nil
}

// Found is a plugin found by List.
type Found struct {
	// Name is how to refer to the plugin: the binary name for plugins in
	// PATH, the repository for installed ones.
	Name string
	// Version is the installed version; empty for plugins in PATH.
	Version string
	// Path is the executable.
	Path string
	// Source is "path" or "installed".
	Source string
}

// List finds every plugin binary in PATH (files named fleeting-plugin-*)
// and every installed plugin version under installDir ("" means
// InstallDir()).
func List(installDir string) ([]Found, error) {
	var out []Found
	seen := map[string]bool{}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			continue
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if !strings.HasPrefix(name, BinaryPrefix) || seen[name] {
				continue
			}
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				continue
			}
			seen[name] = true
			out = append(out, Found{Name: name, Path: p, Source: "path"})
		}
	}
	if installDir == "" {
		installDir = InstallDir()
	}
	if installDir == "" {
		return out, nil
	}
	err := filepath.WalkDir(installDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == installDir && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || d.Name() != pluginFile() {
			return nil
		}
		rel, err := filepath.Rel(installDir, p)
		if err != nil {
			return nil
		}
		parts := strings.Split(filepath.ToSlash(rel), "/")
		if len(parts) < 3 {
			return nil
		}
		ver := unescapePath(parts[len(parts)-2])
		if _, ok := parseVersion(ver); !ok {
			return nil
		}
		out = append(out, Found{
			Name:    unescapePath(strings.Join(parts[:len(parts)-2], "/")),
			Version: ver,
			Path:    p,
			Source:  "installed",
		})
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("listing installed plugins in %s: %w", installDir, err)
	}
	return out, nil
}
