package ci

import (
	"strings"
)

// maxReferenceDepth is GitLab's limit on !reference nesting.
const maxReferenceDepth = 10

// resolveRefs replaces every !reference with the value it points at,
// looked up in the configuration after extends, as GitLab's tag resolver
// does. References inside the referenced value are resolved too.
func (c *compiler) resolveRefs(root *node) *node {
	r := &refResolver{c: c, root: root, memo: map[*node]*node{}, refs: map[string]*node{}, active: map[string]bool{}}
	return r.walk(root)
}

type refResolver struct {
	c      *compiler
	root   *node
	memo   map[*node]*node
	refs   map[string]*node // resolved value per reference path
	active map[string]bool  // references being resolved, for cycles
}

func refPath(n *node) []string {
	p := make([]string, len(n.seq))
	for i, s := range n.seq {
		p[i] = s.str
	}
	return p
}

func (r *refResolver) walk(n *node) *node {
	if n == nil {
		return nil
	}
	if v, ok := r.memo[n]; ok {
		return v
	}
	var out *node
	switch n.kind {
	case kRef:
		out = r.deref(n)
	case kMap:
		changed := false
		m := make([]entry, len(n.m))
		for i, e := range n.m {
			m[i] = e
			m[i].val = r.walk(e.val)
			changed = changed || m[i].val != e.val
		}
		out = n
		if changed {
			c := *n
			c.m = m
			out = &c
		}
	case kSeq:
		changed := false
		s := make([]*node, len(n.seq))
		for i, e := range n.seq {
			s[i] = r.walk(e)
			changed = changed || s[i] != e
		}
		out = n
		if changed {
			c := *n
			c.seq = s
			out = &c
		}
	default:
		out = n
	}
	r.memo[n] = out
	return out
}

func (r *refResolver) deref(n *node) *node {
	path := refPath(n)
	show := "!reference [" + strings.Join(path, ", ") + "]"
	key := strings.Join(path, "\x00")
	if v, ok := r.refs[key]; ok {
		return v
	}
	if r.active[key] {
		r.c.d.errorf(n.pos, "%s: circular references detected", show)
		return &node{kind: kNull, pos: n.pos}
	}
	if len(r.active) >= maxReferenceDepth {
		r.c.d.errorf(n.pos, "%s: too many nested references (more than %d)", show, maxReferenceDepth)
		return &node{kind: kNull, pos: n.pos}
	}
	cur := r.root
	for _, k := range path {
		if cur.kind != kMap {
			cur = nil
			break
		}
		cur = cur.get(k)
		if cur == nil {
			break
		}
	}
	if cur == nil {
		r.c.unresolved(n.pos, "%s could not be found", show)
		return &node{kind: kNull, pos: n.pos}
	}
	r.active[key] = true
	v := r.walk(cur)
	delete(r.active, key)
	r.refs[key] = v
	return v
}
