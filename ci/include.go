package ci

import (
	"errors"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// load reads the main file and, depth first, every local include, and
// merges them the way GitLab does: included files first, in order, then the
// including file deep-merged over them.
func (c *compiler) load() *node {
	p := c.src.Path
	if p == "" {
		p = ".gitlab-ci.yml"
	}
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	c.mainFile = p
	root := c.loadFile(p, Pos{File: p}, nil, true)
	return root
}

func (c *compiler) loadFile(name string, from Pos, stack []string, main bool) *node {
	if c.ioErr != nil {
		return nil
	}
	// A file over the limit is a configuration error, found before it is
	// read (a 50 MB file is never loaded into memory).
	if st, err := fs.Stat(c.src.FS, name); err == nil && !st.IsDir() && st.Size() > int64(c.lim.MaxFileBytes) {
		pos := Pos{File: name}
		if !main {
			pos = from
		}
		c.d.errorf(pos, "%s is %d bytes, larger than the limit of %d bytes (max_yaml_size_bytes)", name, st.Size(), c.lim.MaxFileBytes)
		return nil
	}
	data, err := fs.ReadFile(c.src.FS, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
			if main {
				c.d.errorf(Pos{File: name}, "configuration file %s does not exist", name)
			} else {
				c.d.errorf(from, "include: local file %s does not exist", name)
			}
			return nil
		}
		c.ioErr = wrapf(err, "reading %s", name)
		return nil
	}
	root := parseYAML(name, data, &c.d, c.lim)
	if root == nil {
		if main && !c.d.failed() {
			c.d.errorf(Pos{File: name, Line: 1, Col: 1}, "configuration is empty")
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
	stack = append(stack, name)
	var merged *node
	for _, spec := range c.includeSpecs(inc.val) {
		for _, f := range c.includeFiles(spec) {
			if cyc := indexOf(stack, f); cyc >= 0 {
				chain := append(append([]string(nil), stack[cyc:]...), f)
				c.d.errorf(spec.pos, "include cycle: %s", strings.Join(chain, " → "))
				continue
			}
			if c.included[f] {
				continue // GitLab includes a file once however often it is named
			}
			c.included[f] = true
			if len(c.included) > c.lim.MaxIncludes {
				c.d.errorf(spec.pos, "more than %d included files", c.lim.MaxIncludes)
				return nil
			}
			if len(stack) > c.lim.MaxDepth {
				c.d.errorf(spec.pos, "includes nested more than %d levels", c.lim.MaxDepth)
				return nil
			}
			sub := c.loadFile(f, spec.pos, stack, false)
			if sub != nil {
				merged = deepMerge(merged, sub)
			}
		}
	}
	return deepMerge(merged, root.without("include"))
}

type includeSpec struct {
	local string
	pos   Pos
}

// includeSpecs parses include: a string, a mapping, or a list of them.
// Remote, template, project and component includes need a server and are
// errors; rules are evaluated now.
func (c *compiler) includeSpecs(n *node) []includeSpec {
	var out []includeSpec
	var one func(n *node)
	one = func(n *node) {
		switch n.kind {
		case kNull:
		case kScalar:
			s := n.str
			if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
				c.d.errorf(n.pos, "include: remote includes are not supported (offline compiler); vendor the file and use include: local")
				return
			}
			out = append(out, includeSpec{local: s, pos: n.pos})
		case kMap:
			var local *node
			var rules *node
			for _, e := range n.m {
				switch e.key {
				case "local":
					local = e.val
				case "rules":
					rules = e.val
				case "remote", "template", "project", "component":
					c.d.errorf(e.keyPos, "include:%s is not supported; only include:local is", e.key)
					return
				case "file", "ref", "inputs", "cache", "integrity":
					c.d.errorf(e.keyPos, "include:%s is not supported", e.key)
					return
				default:
					c.d.errorf(e.keyPos, "unknown keyword %q in include", e.key)
					return
				}
			}
			s, ok := scalarString(local)
			if !ok {
				c.d.errorf(n.pos, "include entry needs local: PATH")
				return
			}
			if rules != nil {
				ok, err := c.includeRulesMatch(rules)
				if err != nil || !ok {
					return
				}
			}
			out = append(out, includeSpec{local: s, pos: local.pos})
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

// includeFiles turns one local include into file names: variables
// expanded, the leading slash dropped, wildcards matched against the FS.
func (c *compiler) includeFiles(spec includeSpec) []string {
	p := expandVars(spec.local, c.baseVars)
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		c.d.errorf(spec.pos, "include: local path is empty")
		return nil
	}
	clean := path.Clean(p)
	if !fs.ValidPath(clean) {
		c.d.errorf(spec.pos, "include: local path %s leaves the repository", spec.local)
		return nil
	}
	if !strings.HasSuffix(clean, ".yml") && !strings.HasSuffix(clean, ".yaml") {
		c.d.errorf(spec.pos, "include: local file %s does not have a .yml or .yaml extension", clean)
		return nil
	}
	if !strings.ContainsAny(clean, "*?[{") {
		return []string{clean}
	}
	var matches []string
	err := fs.WalkDir(c.src.FS, ".", func(p string, de fs.DirEntry, err error) error {
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
		c.d.errorf(spec.pos, "include: no local file matches %s", clean)
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
