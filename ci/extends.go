package ci

import (
	"strings"
)

// maxExtendsDepth is GitLab's limit on extends chains (eleven levels of
// inheritance: a job and ten ancestors).
const maxExtendsDepth = 10

// extend resolves extends across the whole configuration, as GitLab's
// Config::Extendable does after includes and before !reference: each
// entry is the deep merge of its bases, in order, then its own keys.
func (c *compiler) extend(root *node) *node {
	ex := &extender{c: c, root: root, done: map[string]*node{}, depth: map[string]int{}, active: map[string]bool{}, index: map[string]int{}}
	for i, e := range root.m {
		ex.index[e.key] = i
	}
	out := &node{kind: kMap, pos: root.pos, m: make([]entry, len(root.m))}
	for i, e := range root.m {
		out.m[i] = e
		if !mayBeJob(e.key) || e.val.kind != kMap || e.val.get("extends") == nil {
			continue
		}
		out.m[i].val = ex.resolve(e.key, e.keyPos, nil)
		if ex.budget > c.lim.MaxNodes {
			c.d.errorf(e.keyPos, "extends expands the configuration to more than %d values", c.lim.MaxNodes)
			return root
		}
	}
	return out
}

type extender struct {
	c      *compiler
	root   *node
	done   map[string]*node
	depth  map[string]int // of a resolved job: its longest chain of extends
	active map[string]bool
	index  map[string]int
	budget int // merged entries created, against Limits.MaxNodes
}

func (x *extender) entry(name string) *entry {
	i, ok := x.index[name]
	if !ok {
		return nil
	}
	return &x.root.m[i]
}

func (x *extender) resolve(name string, at Pos, chain []string) *node {
	if v, ok := x.done[name]; ok {
		return v
	}
	e := x.entry(name)
	if e == nil {
		return nil
	}
	job := e.val
	ext := job.get("extends")
	if job.kind != kMap || ext == nil || ext.isNull() { // GitLab allows a null extends (its items commented out)
		return job
	}
	if x.active[name] {
		x.c.d.errorf(at, "%s: circular dependency detected in extends: %s", chain[0], strings.Join(append(chain, name), " → "))
		return job
	}
	var bases []*node
	switch ext.kind {
	case kScalar:
		bases = []*node{ext}
	case kSeq:
		bases = ext.seq
	default:
		x.c.d.errorf(ext.pos, "%s: extends must be a job name or a list of job names, found %s", name, ext.describe())
		return job
	}
	x.active[name] = true
	defer delete(x.active, name)
	var merged *node
	ok, depth := true, 0
	for _, b := range bases {
		bn, isStr := scalarString(b)
		if !isStr {
			x.c.d.errorf(b.pos, "%s: extends entries must be job names, found %s", name, b.describe())
			ok = false
			continue
		}
		be := x.entry(bn)
		if be == nil {
			x.c.unresolved(b.pos, "%s: unknown key in extends: %s", name, bn)
			// When an include did not load, the base may be there: the
			// bases that are known still apply.
			ok = ok && x.c.incomplete
			continue
		}
		if be.val.kind != kMap {
			x.c.d.errorf(b.pos, "%s: invalid base in extends: %s is %s, not a mapping", name, bn, be.val.describe())
			ok = false
			continue
		}
		if x.budget > x.c.lim.MaxNodes {
			return job
		}
		base := x.resolve(bn, b.pos, append(chain, name))
		merged = deepMergeCount(merged, base, &x.budget)
		depth = max(depth, x.depth[bn]+1)
	}
	if !ok {
		return job
	}
	// A job's depth comes from its bases' (resolved now or earlier), so
	// the limit holds whatever the file's order; reported once, at the
	// first job past it.
	x.depth[name] = depth
	if depth > maxExtendsDepth && depth-1 <= maxExtendsDepth {
		x.c.d.errorf(ext.pos, "%s: nesting too deep in extends (more than %d levels)", name, maxExtendsDepth)
		x.done[name] = job
		return job
	}
	out := deepMergeCount(merged, job, &x.budget)
	x.done[name] = out
	return out
}
