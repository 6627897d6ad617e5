package ci

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io/fs"
	"net/url"
	"path"
	"sort"
	"strings"
	"time"
)

// tree is a set of files include:local reads from: the pipeline's own
// repository, or the project a project or component file came from.
type tree struct {
	fs   fs.FS
	name string // prefixes paths in positions ("" for the pipeline's repository)
	key  string // prefixes paths in include identities
}

// source is one configuration file to load.
type source struct {
	key  string // identity, for cycles and files included twice
	loc  string // the file's name in positions
	data []byte
	tree *tree // where its local includes are read; nil for remote and template files
	args []inputArg
	at   Pos // where it was included (its inputs given)
	main bool
	// component is the context of the component the file belongs to (the
	// component's template, and the local files it includes): what
	// $[[ component.X ]] reads. Nil for every other file.
	component *componentContext
}

// componentContext is what a component's spec:component may expose to
// interpolation (GitLab's Header::Component values).
type componentContext struct {
	name, sha, version, reference string
}

// resolved memoizes resolver answers: a file included twice (with
// different inputs, or from two files) is fetched once.
type resolved struct {
	f   *IncludedFile
	err error
}

// load reads the main file and, depth first, every include, and merges
// them the way GitLab does: included files first, in order, then the
// including file deep-merged over them.
func (c *compiler) load() *node {
	p := c.src.Path
	if p == "" {
		p = ".gitlab-ci.yml"
	}
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	c.mainFile = p
	repo := &tree{fs: c.src.FS}
	data, ok := c.readLocal(repo, p, Pos{File: p}, true)
	if !ok {
		return nil
	}
	args, err := pipelineInputs(c.env.Inputs, Pos{File: p, Line: 1, Col: 1})
	if err != nil {
		c.ioErr = wrapf(err, "compiling CI configuration")
		return nil
	}
	return c.loadSource(source{key: p, loc: p, data: data, tree: repo, args: args, at: Pos{File: p, Line: 1, Col: 1}, main: true}, nil)
}

// readLocal reads name from t. A file over the limit is a configuration
// error, found before it is read (a 50 MB file is never loaded).
func (c *compiler) readLocal(t *tree, name string, from Pos, main bool) ([]byte, bool) {
	if c.ioErr != nil {
		return nil, false
	}
	shown := t.name + name
	pos := from
	if main {
		pos = Pos{File: shown}
	}
	if st, err := fs.Stat(t.fs, name); err == nil && !st.IsDir() && st.Size() > int64(c.lim.MaxFileBytes) {
		c.d.errorf(pos, "%s is %d bytes, larger than the limit of %d bytes (max_yaml_size_bytes)", shown, st.Size(), c.lim.MaxFileBytes)
		return nil, false
	}
	data, err := fs.ReadFile(t.fs, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
			if main {
				c.d.errorf(pos, "configuration file %s does not exist", shown)
			} else {
				c.d.errorf(pos, "include: local file %s does not exist", shown)
			}
			return nil, false
		}
		c.ioErr = wrapf(err, "reading %s", shown)
		return nil, false
	}
	return data, true
}

func (c *compiler) loadSource(s source, stack []string) *node {
	if c.ioErr != nil {
		return nil
	}
	before := len(c.d.errs)
	docs := parseYAML(s.loc, s.data, &c.d, c.lim)
	if len(c.d.errs) != before {
		return nil
	}
	what := "pipeline inputs"
	if !s.main {
		what = "`" + s.loc + "`"
	}
	root, ok := c.header(docs, s.loc, s.args, s.at, what, s.component)
	if !ok {
		return nil
	}
	if root == nil {
		if s.main && !c.d.failed() {
			c.d.errorf(Pos{File: s.loc, Line: 1, Col: 1}, "configuration is empty")
		}
		return nil
	}
	if root.kind != kMap {
		c.d.errorf(root.pos, "configuration must be a mapping of keywords and jobs, found %s", root.describe())
		return nil
	}
	inc := root.entry("include")
	if inc == nil {
		return root
	}
	stack = append(stack, s.key)
	c.names[s.key] = s.loc
	var merged *node
	for _, spec := range c.includeSpecs(inc.val) {
		for _, t := range c.includeTargets(s, spec) {
			if cyc := indexOf(stack, t.key); cyc >= 0 {
				var chain []string
				for _, k := range append(stack[cyc:], t.key) {
					chain = append(chain, c.names[k])
				}
				c.d.errorf(spec.pos, "include cycle: %s", strings.Join(chain, " → "))
				continue
			}
			id := t.key + "\x00" + inputsKey(spec.inputs)
			if c.included[id] {
				continue // GitLab includes a file once however often it is named
			}
			c.included[id] = true
			if len(c.included) > c.lim.MaxIncludes {
				c.d.errorf(spec.pos, "more than %d included files (Maximum of %d nested includes are allowed!)", c.lim.MaxIncludes, c.lim.MaxIncludes)
				return nil
			}
			if len(stack) > c.lim.MaxDepth {
				c.d.errorf(spec.pos, "includes nested more than %d levels", c.lim.MaxDepth)
				return nil
			}
			sub, ok := c.fetch(t, spec)
			if !ok {
				continue
			}
			if n := c.loadSource(sub, stack); n != nil {
				merged = deepMerge(merged, n)
			}
		}
	}
	return deepMerge(merged, root.without("include"))
}

// includeSpec is one parsed include entry (rules already evaluated).
type includeSpec struct {
	kind      string // local, project, remote, template, component
	value     string // path, URL, template name or component address, variables expanded
	pos       Pos    // of the value
	project   string
	ref       string
	files     []strAt // include:project:file
	integrity string
	cacheTTL  time.Duration
	inputs    *node // include:inputs, nil if none
	args      []inputArg
}

type strAt struct {
	s   string
	pos Pos
}

// target is one file an include names: a local file (a wildcard gives
// several), one file of a project, a URL, a template or a component.
type target struct {
	kind string
	key  string // identity: cycles, files included twice, resolver memo
	path string // local path or project file
	tree *tree  // local: where to read
	pos  Pos
	// component: local files of a component's project carry its context.
	component *componentContext
}

var includeKinds = []string{"local", "project", "remote", "template", "component"}

// includeSpecs parses include: a string, a mapping, or a list of them.
// Rules are evaluated now; entries whose rules do not match are dropped.
func (c *compiler) includeSpecs(n *node) []includeSpec {
	var out []includeSpec
	var one func(n *node)
	one = func(n *node) {
		switch n.kind {
		case kNull:
		case kScalar:
			s := expandVars(n.str, c.baseVars)
			if isURL(s) {
				out = append(out, includeSpec{kind: "remote", value: s, pos: n.pos})
				return
			}
			out = append(out, includeSpec{kind: "local", value: s, pos: n.pos})
		case kMap:
			if spec, ok := c.includeMapping(n); ok {
				out = append(out, spec)
			}
		case kSeq:
			for _, x := range n.seq {
				if x.kind == kSeq {
					c.d.errorf(x.pos, "include entries must be strings or mappings, found a list")
					continue
				}
				one(x)
			}
		default:
			c.d.errorf(n.pos, "include must be a string, a mapping or a list, found %s", n.describe())
		}
	}
	one(n)
	return out
}

// includeMapping parses one include mapping, GitLab's include entry.
func (c *compiler) includeMapping(n *node) (includeSpec, bool) {
	var spec includeSpec
	var kinds []string
	var rules *node
	before := len(c.d.errs)
	for _, e := range n.m {
		switch e.key {
		case "local", "project", "remote", "template", "component":
			kinds = append(kinds, e.key)
		case "file", "ref", "integrity", "cache", "inputs":
		case "rules":
			rules = e.val
		case "artifact", "job":
			c.d.errorf(e.keyPos, "include:%s is only for child pipelines (trigger:include)", e.key)
		default:
			c.d.errorf(e.keyPos, "unknown keyword %q in include (allowed: %s, file, ref, integrity, cache, inputs, rules)", e.key, strings.Join(includeKinds, ", "))
		}
	}
	switch len(kinds) {
	case 0:
		c.d.errorf(n.pos, "include entry does not have a valid subkey for include. Valid subkeys are: `%s`", strings.Join(includeKinds, "`, `"))
		return spec, false
	case 1:
	default:
		c.d.errorf(n.pos, "Each include must use only one of: `%s`", strings.Join(includeKinds, "`, `"))
		return spec, false
	}
	spec.kind = kinds[0]
	only := func(key string, kinds ...string) {
		if e := n.entry(key); e != nil && indexOf(kinds, spec.kind) < 0 {
			c.d.errorf(e.keyPos, "include:%s can only be used with include:%s", key, strings.Join(kinds, " or include:"))
		}
	}
	only("file", "project")
	only("ref", "project")
	only("integrity", "remote")
	only("cache", "remote")
	val := n.get(spec.kind)
	if spec.kind == "project" {
		// GitLab once took a list of projects and still takes the first.
		if val != nil && val.kind == kSeq && len(val.seq) > 0 {
			val = val.seq[0]
		}
	}
	s, ok := c.str(val, "include:"+spec.kind)
	if !ok {
		return spec, false
	}
	s = expandVars(s, c.baseVars)
	spec.pos = val.pos
	switch spec.kind {
	case "project":
		spec.project = strings.ToLower(strings.Trim(s, "/"))
		if spec.project == "" {
			c.d.errorf(val.pos, "include:project is empty")
		}
		if r := n.get("ref"); r != nil {
			if rs, ok := c.str(r, "include:ref"); ok {
				spec.ref = expandVars(rs, c.baseVars)
			}
		}
		f := n.get("file")
		switch {
		case f == nil || f.isNull():
			c.d.errorf(val.pos, "include:project needs file: a path or a list of paths")
		case f.kind == kSeq:
			for _, x := range f.seq {
				if fs, ok := c.str(x, "include:file"); ok {
					spec.files = append(spec.files, strAt{expandVars(fs, c.baseVars), x.pos})
				}
			}
		default:
			if fs, ok := c.str(f, "include:file"); ok {
				spec.files = append(spec.files, strAt{expandVars(fs, c.baseVars), f.pos})
			}
		}
	case "remote":
		spec.value = s
		if !isURL(s) {
			c.d.errorf(val.pos, "Remote file `%s` does not have a valid address!", s)
		}
		if i := n.get("integrity"); i != nil {
			if is, ok := c.str(i, "include:integrity"); ok {
				if _, ok := parseIntegrity(is); !ok {
					c.d.errorf(i.pos, "include:integrity should be sha256- followed by the base64 of the file's SHA-256 digest")
				}
				spec.integrity = is
			}
		}
		if cv := n.get("cache"); cv != nil && !cv.isNull() {
			if b, ok := yaml11Bool(cv); ok {
				if b {
					spec.cacheTTL = time.Hour
				}
			} else if ds, ok := c.str(cv, "include:cache"); ok {
				d, err := ParseDuration(ds)
				switch {
				case err != nil:
					c.d.errorf(cv.pos, "include:cache should be true, false or a duration: %v", err)
				case d < time.Minute:
					c.d.errorf(cv.pos, "include:cache must be at least 1 minute")
				default:
					spec.cacheTTL = d
				}
			}
		}
	default:
		spec.value = s
	}
	if in := n.entry("inputs"); in != nil && !in.val.isNull() {
		if c.mapping(in.val, "include:inputs") {
			spec.inputs = in.val
			for _, e := range in.val.m {
				spec.args = append(spec.args, inputArg{name: e.key, pos: e.keyPos, val: e.val})
			}
		}
	}
	if len(c.d.errs) != before {
		return spec, false
	}
	if rules != nil {
		ok, err := c.includeRulesMatch(rules)
		if err != nil || !ok {
			return spec, false
		}
	}
	return spec, true
}

// isURL is GitLab's UrlSanitizer.valid?: an http or https URL with a host.
func isURL(s string) bool {
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func hasYAMLExt(p string) bool {
	b := strings.ToLower(path.Base(p))
	return len(b) > 4 && strings.HasSuffix(b, ".yml") || len(b) > 5 && strings.HasSuffix(b, ".yaml")
}

// includeTargets turns one include into the files it names.
func (c *compiler) includeTargets(from source, spec includeSpec) []target {
	switch spec.kind {
	case "local":
		if from.tree == nil {
			c.d.errorf(spec.pos, "include:local %s in %s: a remote or template file has no project to read local files from", spec.value, from.loc)
			return nil
		}
		var out []target
		for _, f := range c.localFiles(from.tree, spec) {
			out = append(out, target{kind: "local", key: from.tree.key + f, path: f, tree: from.tree, pos: spec.pos, component: from.component})
		}
		return out
	case "project":
		var out []target
		for _, f := range spec.files {
			p := strings.TrimLeft(f.s, "/")
			if !hasYAMLExt(p) {
				c.d.errorf(f.pos, "Included file `%s` does not have YAML extension!", f.s)
				continue
			}
			if !fs.ValidPath(path.Clean(p)) || path.Clean(p) != p {
				c.d.errorf(f.pos, "Project `%s` file `%s` is not a valid path in the project", spec.project, f.s)
				continue
			}
			out = append(out, target{kind: "project", key: "project:" + spec.project + "@" + spec.ref + ":" + p, path: p, pos: f.pos})
		}
		return out
	case "remote":
		if !hasYAMLExt(spec.value) {
			c.d.errorf(spec.pos, "Included file `%s` does not have YAML extension!", spec.value)
			return nil
		}
		return []target{{kind: "remote", key: "remote:" + spec.value, pos: spec.pos}}
	case "template":
		name := spec.value
		if !strings.HasSuffix(name, ".gitlab-ci.yml") || !fs.ValidPath(name) {
			c.d.errorf(spec.pos, "Template file `%s` is not a valid location!", name)
			return nil
		}
		return []target{{kind: "template", key: "template:" + name, pos: spec.pos}}
	case "component":
		if _, err := ParseComponent(spec.value); err != nil {
			c.d.errorf(spec.pos, "Component '%s' - %v", spec.value, err)
			return nil
		}
		return []target{{kind: "component", key: "component:" + spec.value, pos: spec.pos}}
	}
	return nil
}

// fetch reads or resolves one target into a source to load.
func (c *compiler) fetch(t target, spec includeSpec) (source, bool) {
	s := source{key: t.key, args: spec.args, at: spec.pos}
	if spec.inputs != nil {
		s.at = spec.inputs.pos
	}
	if t.kind == "local" {
		data, ok := c.readLocal(t.tree, t.path, t.pos, false)
		if !ok {
			return s, false
		}
		s.loc, s.data, s.tree, s.component = t.tree.name+t.path, data, t.tree, t.component
		return s, true
	}
	if c.env.Includes == nil {
		c.d.errorf(t.pos, "include:%s %s cannot be resolved: nothing here fetches %s includes (no include resolver)", t.kind, includeName(t, spec), t.kind)
		return s, false
	}
	r, ok := c.resolvedFiles[t.key]
	if !ok {
		var ref ComponentRef
		switch t.kind {
		case "project":
			r.f, r.err = c.env.Includes.Project(c.ctx, spec.project, spec.ref, t.path)
		case "remote":
			r.f, r.err = c.env.Includes.Remote(c.ctx, spec.value, RemoteOptions{Integrity: spec.integrity, CacheTTL: spec.cacheTTL})
		case "template":
			r.f, r.err = c.env.Includes.Template(c.ctx, spec.value)
		case "component":
			ref, _ = ParseComponent(spec.value)
			r.f, r.err = c.env.Includes.Component(c.ctx, ref)
		}
		if r.err == nil && r.f == nil {
			r.err = IncludeErrorf("include:%s %s: not found", t.kind, includeName(t, spec))
		}
		c.resolvedFiles[t.key] = r
	}
	if r.err != nil {
		var ie *IncludeError
		switch {
		case errors.Is(r.err, ErrIncludeUnavailable):
			// The resolver tells the user; what the file might define
			// is unknown from here on.
			c.incomplete = true
		case errors.As(r.err, &ie):
			c.d.errorf(t.pos, "%s", ie.Msg)
		case c.ioErr == nil:
			c.ioErr = wrapf(r.err, "resolving include:%s %s", t.kind, includeName(t, spec))
		}
		return s, false
	}
	f := r.f
	switch t.kind {
	case "project":
		s.loc, s.data = f.Location, f.Data
		if f.Tree != nil {
			s.tree = &tree{fs: f.Tree, name: f.TreeName, key: "project:" + spec.project + "@" + spec.ref + ":"}
		}
	case "remote":
		s.loc, s.data = f.Location, f.Data
		if spec.integrity != "" {
			want, _ := parseIntegrity(spec.integrity)
			got := sha256.Sum256(f.Data)
			if string(got[:]) != string(want) {
				c.d.errorf(t.pos, "Remote file `%s` does not match its integrity (its content is sha256-%s)", spec.value, base64.StdEncoding.EncodeToString(got[:]))
				return s, false
			}
		}
	case "template":
		s.loc, s.data = f.Location, f.Data
	case "component":
		ref, _ := ParseComponent(spec.value)
		if f.Tree == nil {
			c.d.errorf(t.pos, "Component '%s' - content not found", spec.value)
			return s, false
		}
		ct := &tree{fs: f.Tree, name: f.TreeName, key: "component:" + ref.Host + "/" + ref.Project + "@" + ref.Version + ":"}
		for _, p := range ComponentFiles(ref.Name) {
			if st, err := fs.Stat(ct.fs, p); err != nil || st.IsDir() {
				continue
			}
			data, ok := c.readLocal(ct, p, t.pos, false)
			if !ok {
				return s, false
			}
			s.loc, s.data, s.tree = ct.name+p, data, ct
			s.component = &componentContext{name: ref.Name, sha: f.SHA, version: f.Version, reference: ref.Version}
			return s, true
		}
		c.d.errorf(t.pos, "Component '%s' - content not found (no %s)", spec.value, strings.Join(ComponentFiles(ref.Name), " or "))
		return s, false
	}
	if s.loc == "" {
		s.loc = includeName(t, spec)
	}
	return s, true
}

// includeName names an include in messages.
func includeName(t target, spec includeSpec) string {
	if t.kind == "project" {
		n := spec.project + ":" + t.path
		if spec.ref != "" {
			n += "@" + spec.ref
		}
		return n
	}
	return spec.value
}

// parseIntegrity reads "sha256-BASE64" into the digest.
func parseIntegrity(s string) ([]byte, bool) {
	b64, ok := strings.CutPrefix(s, "sha256-")
	if !ok {
		return nil, false
	}
	d, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(d) != sha256.Size {
		return nil, false
	}
	return d, true
}

// localFiles turns one local include into file names of t: variables
// expanded, the leading slash dropped, wildcards matched.
func (c *compiler) localFiles(t *tree, spec includeSpec) []string {
	p := strings.TrimPrefix(spec.value, "/")
	if p == "" {
		c.d.errorf(spec.pos, "include: local path is empty")
		return nil
	}
	clean := path.Clean(p)
	if !fs.ValidPath(clean) {
		c.d.errorf(spec.pos, "include: local path %s leaves the repository", spec.value)
		return nil
	}
	if !strings.HasSuffix(clean, ".yml") && !strings.HasSuffix(clean, ".yaml") {
		c.d.errorf(spec.pos, "include: local file %s does not have a .yml or .yaml extension", clean)
		return nil
	}
	// GitLab expands a local path only when it has a *; then ** and the
	// rest of fnmatch's syntax apply. Without one it is a file name.
	if !strings.Contains(clean, "*") {
		return []string{clean}
	}
	var matches []string
	err := fs.WalkDir(t.fs, ".", func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p == ".git" {
			return fs.SkipDir
		}
		if !de.IsDir() && matchGlob(clean, p, true) {
			matches = append(matches, p)
		}
		return nil
	})
	if err != nil {
		c.ioErr = wrapf(err, "listing files for include %s", clean)
		return nil
	}
	sort.Strings(matches)
	if len(matches) == 0 {
		// GitLab includes nothing, silently; a warning says so.
		c.d.warnf(spec.pos, "include: no local file matches %s: nothing is included", clean)
	}
	return matches
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}
